"""Ray backend: workers are Ray actors on cluster nodes, each running the local worker process.

`cluster` joins the cluster and reads its inventory; `actor` is the rank actor on a node;
`merge` turns n ranks' event streams into one; `handle` is the controller's view of one
job's ranks; `backend` places and starts them and bridges their events into local pipes.
"""
