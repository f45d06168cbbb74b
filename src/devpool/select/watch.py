"""How a recording worker sees which code ran: the cheapest hook the interpreter offers.

Every watch answers the same two questions for the stretch since it was last asked: which
code objects ran, and which of them ran while a module was being imported (an import's
work may shape every later test, so the recorder counts it for all of them).

- `Monitor` (Python ≥ 3.12): `sys.monitoring` PY_START and PY_RESUME events, each code
  location disabled after its first event until the next `take`. A function called a
  million times costs one Python call per test. About 1.1 × a plain run.
- `NativeHook` (Python 3.11): devpool's own frame-evaluation hook (PEP 523, _calls.c),
  called as each frame starts or resumes. About 1.1 × in the tests' own code.
- `Profiler` (Python 3.10, or 3.11 built without a compiler): cProfile's C profile hook.
  No Python runs per call, but any profile hook makes 3.11 trace each instruction, which
  turns off its specialised instructions: about 2 × in call-heavy code. Threads started
  later get a Python profile function.
- `Tracer`: a Python trace function, where the profile hook is taken (a profiler of the
  project's) and no monitoring exists. About 3 × in call-heavy code.

coverage.py (pytest-cov) takes the trace hook on 3.11 and a tool id of its own on 3.12,
so it and a watch run side by side.
"""

from __future__ import annotations

import cProfile
import sys
import threading
from types import CodeType, FrameType, ModuleType
from typing import Any, Protocol

MODULE = "<module>"
# Debugger, coverage, profiler and optimizer own ids 0, 1, 2 and 5; a test that runs
# cProfile on 3.12 needs 2 free.
_MONITOR_IDS = (3, 4)
_MONITOR_NAME = "devpool-select"
# sys.monitoring exists from 3.12 on; typed Any, since the type checker targets 3.10.
monitoring: Any = getattr(sys, "monitoring", None)
_calls: ModuleType | None
try:  # built on Python 3.11 unless the build had no compiler (setup.py)
    from devpool.select import _calls
except ImportError:
    _calls = None


class Watch(Protocol):
    how: str  # in messages: "monitoring", "profiler", "trace function"

    def start(self) -> str:
        """Watch from now on; a reason when something took the hook while paused."""

    def stop(self) -> str:
        """Stop watching; a reason when something took the hook while watching."""

    def take(self) -> tuple[set[CodeType], set[CodeType]]:
        """The code that ran since the last take, and the part of it an import ran."""


def watch_for_this_interpreter() -> Watch | None:
    """The cheapest watch whose hook is free, or None when every hook is taken."""
    if monitoring is not None:
        for tool in _MONITOR_IDS:
            if monitoring.get_tool(tool) is None:
                return Monitor(tool)
    elif _calls is not None:
        return NativeHook()
    elif sys.getprofile() is None:
        return Profiler()
    if sys.gettrace() is None:
        return Tracer()
    return None


class Monitor:
    """sys.monitoring (PEP 669): one event per code location per stretch."""

    how = "monitoring"

    def __init__(self, tool: int) -> None:
        events = monitoring.events
        self.tool = tool
        self.events = events.PY_START | events.PY_RESUME
        self.unwind = events.PY_UNWIND
        self.codes: set[CodeType] = set()
        self.imported: set[CodeType] = set()
        self.importing = 0
        self.on = False
        self._claim()

    def _claim(self) -> bool:
        """Hold the tool id with devpool's callbacks; False when another tool holds it."""
        holder = monitoring.get_tool(self.tool)
        if holder == _MONITOR_NAME:
            return True
        if holder is not None:
            return False
        monitoring.use_tool_id(self.tool, _MONITOR_NAME)
        events = monitoring.events
        monitoring.register_callback(self.tool, events.PY_START, self._start)
        monitoring.register_callback(self.tool, events.PY_RESUME, self._start)
        monitoring.register_callback(self.tool, events.PY_RETURN, self._return)
        monitoring.register_callback(self.tool, events.PY_UNWIND, self._unwind)
        return True

    def _start(self, code: CodeType, offset: int) -> Any:
        self.codes.add(code)
        if self.importing:
            self.imported.add(code)
        if code.co_name != MODULE:
            return monitoring.DISABLE
        # An import begins: what it runs counts for every later test, including code that
        # already ran in this stretch and is disabled now, so every location fires again.
        self.importing += 1
        self.imported.add(code)
        monitoring.set_local_events(self.tool, code, monitoring.events.PY_RETURN)
        monitoring.set_events(self.tool, self.events | self.unwind)
        monitoring.restart_events()
        return None

    def _return(self, code: CodeType, offset: int, value: object) -> Any:
        if code.co_name == MODULE:
            self._imported(code)
        return None

    def _unwind(self, code: CodeType, offset: int, error: BaseException) -> Any:
        if code.co_name == MODULE:  # the import raised
            self._imported(code)
        return None

    def _imported(self, code: CodeType) -> None:
        monitoring.set_local_events(self.tool, code, 0)
        self.importing = max(0, self.importing - 1)
        if not self.importing and self.on:
            monitoring.set_events(self.tool, self.events)

    def _taken(self) -> str:
        if monitoring.get_tool(self.tool) != _MONITOR_NAME:
            return "something freed devpool's sys.monitoring tool id"
        wanted = self.events | (self.unwind if self.importing else 0) if self.on else 0
        if monitoring.get_events(self.tool) != wanted:
            return "something changed the events devpool monitors"
        return ""

    def start(self) -> str:
        why = self._taken()
        self.on = True
        if not self._claim():
            return "another tool took devpool's sys.monitoring tool id"
        monitoring.set_events(self.tool, self.events | (self.unwind if self.importing else 0))
        return why

    def stop(self) -> str:
        why = self._taken()
        self.on = False
        if monitoring.get_tool(self.tool) == _MONITOR_NAME:
            monitoring.set_events(self.tool, 0)
        return why

    def take(self) -> tuple[set[CodeType], set[CodeType]]:
        taken = (self.codes, self.imported)
        self.codes, self.imported = set(), set()
        monitoring.restart_events()  # the next stretch sees each location again
        return taken


class NativeHook:
    """devpool's frame-evaluation hook (_calls.c): a pointer set per frame, nothing timed,
    every thread, and the interpreter's specialised instructions left on."""

    how = "frame-evaluation hook"

    def __init__(self) -> None:
        assert _calls is not None
        self.calls = _calls

    def start(self) -> str:
        if self.calls.enable():
            return ""
        return "a debugger or a JIT set its own frame-evaluation hook"

    def stop(self) -> str:
        if self.calls.disable():
            return ""
        return "something replaced devpool's frame-evaluation hook (torch.compile does)"

    def take(self) -> tuple[set[CodeType], set[CodeType]]:
        codes, imported = self.calls.take()
        return set(codes), set(imported)


class Profiler:
    """cProfile's C hook in the thread that installs it; a Python hook in later threads."""

    how = "profiler"

    def __init__(self) -> None:
        self.profiler = cProfile.Profile(builtins=False)
        self.thread_codes: set[CodeType] = set()
        self.on = False
        threading.setprofile(self._thread)

    def _thread(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and self.on:
            self.thread_codes.add(frame.f_code)

    def _taken(self) -> str:
        hook: object = sys.getprofile()  # the Profile object itself, while it is enabled
        return "" if hook is self.profiler else "something replaced devpool's profiler"

    def start(self) -> str:
        why = "" if sys.getprofile() is None else "something set a profile function"
        self.profiler.enable()
        self.on = True
        return why

    def stop(self) -> str:
        why = self._taken()
        self.profiler.disable()
        self.on = False
        return why

    def take(self) -> tuple[set[CodeType], set[CodeType]]:
        if self.on:
            self.profiler.disable()  # ends the open calls, so each has its callees
        stats = self.profiler.getstats()
        self.profiler.clear()
        if self.on:
            self.profiler.enable()
        codes = {entry.code for entry in stats if isinstance(entry.code, CodeType)}
        roots = [code for code in codes if code.co_name == MODULE]
        imported: set[CodeType] = set()
        if roots:  # an import ran: follow its calls (built only then, they cost)
            calls = {
                entry.code: [sub.code for sub in entry.calls or ()]
                for entry in stats
                if isinstance(entry.code, CodeType)
            }
            imported = _reached(calls, roots)
        codes |= self.thread_codes
        self.thread_codes = set()
        return codes, imported


def _reached(calls: dict[CodeType, list[CodeType | str]], roots: list[CodeType]) -> set[CodeType]:
    """Everything the roots called, directly or not (a callee also called from elsewhere
    counts too: more is selected, never less)."""
    seen: set[CodeType] = set()
    stack = list(roots)
    while stack:
        code = stack.pop()
        if code not in seen:
            seen.add(code)
            stack.extend(sub for sub in calls.get(code, ()) if isinstance(sub, CodeType))
    return seen


class Tracer:
    """A Python trace function on 'call' events (no line events but in module code)."""

    how = "trace function"

    def __init__(self) -> None:
        self.codes: set[CodeType] = set()
        self.imported: set[CodeType] = set()
        self.importing = 0
        self.on = False
        threading.settrace(self._trace)

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if not self.on:
            return None
        code = frame.f_code
        self.codes.add(code)
        if self.importing:
            self.imported.add(code)
        if code.co_name == MODULE:
            self.importing += 1
            self.imported.add(code)
            frame.f_trace_lines = False
            return self._module_end
        return None

    def _module_end(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "return":  # also after an exception: it ends with a return event
            self.importing = max(0, self.importing - 1)
        return self._module_end

    def start(self) -> str:
        why = "" if sys.gettrace() is None else "something set a trace function"
        sys.settrace(self._trace)
        self.on = True
        return why

    def stop(self) -> str:
        why = "" if sys.gettrace() == self._trace else "something replaced devpool's trace function"
        sys.settrace(None)
        self.on = False
        return why

    def take(self) -> tuple[set[CodeType], set[CodeType]]:
        taken = (self.codes, self.imported)
        self.codes, self.imported = set(), set()
        return taken
