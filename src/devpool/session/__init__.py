"""The controller: the user's pytest process for one run, and `devpool run`."""
