"""How a recording worker sees which code ran: the cheapest hook the interpreter offers.

Every watch answers the same two questions for the stretch since it was last asked: which
code objects ran, and which of them ran while a module was being imported (an import's
work may shape every later test, so the recorder counts it for all of them).

- `Monitor` (Python ≥ 3.12): `sys.monitoring` events on the project's own code objects,
  each location disabled after its first event until the next `take`. A function called
  a million times costs one Python call per test; code outside the project has no events.
- `NativeHook` (Python 3.11): devpool's own frame-evaluation hook (PEP 523, _calls.c),
  called as each frame starts or resumes, in C.
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

import contextlib
import cProfile
import os
import sys
import threading
from collections.abc import Callable, Iterable
from types import CodeType, FrameType, ModuleType
from typing import Any, Protocol

MODULE = "<module>"
# Code objects by where they are: code compares equal by its bytecode, names and lines, not
# by its file, so two files' identical functions would be one in a set, and each is a block
# of its own. Not by id(): under audit hooks (devpool's own) every id() call is an event.
Where = tuple[str, int, str]
Codes = dict[Where, CodeType]


def where(code: CodeType) -> Where:
    return (code.co_filename, code.co_firstlineno, code.co_name)


def codes_of(codes: Iterable[CodeType]) -> Codes:
    return {where(code): code for code in codes}


def spots_of(
    codes: Iterable[CodeType], source: Callable[[str], str | None]
) -> set[tuple[str, int]]:
    """Where code objects of the project's Python files start: (file, first line), with line
    0 for a module's own code (it starts at line 1, maybe inside a function). source: a file
    name → its path relative to the rootdir when it is one of the project's, else None."""
    spots = set()
    for code in codes:
        rel = source(code.co_filename)
        if rel is not None:
            spots.add((rel, 0 if code.co_name == MODULE else code.co_firstlineno))
    return spots


def module_spots(
    modules: Iterable[ModuleType], source: Callable[[str], str | None]
) -> set[tuple[str, int]]:
    """The top level (line 0) of every project module among modules: it ran at import,
    and may have shaped any later code (constants, decorators, signatures)."""
    spots = set()
    for module in modules:
        filename = getattr(module, "__file__", None)
        rel = source(filename) if isinstance(filename, str) else None
        if rel is not None:
            spots.add((rel, 0))
    return spots


_READ_FLAGS = (os.O_RDONLY, os.O_RDWR)
_NOT_DATA = (".py", ".pyc", ".so", ".pth")


def data_read(args: tuple[Any, ...]) -> str | None:
    """The absolute path of a data file the audit event "open" with these args reads (w+ and
    a+ read back what the process wrote itself: not counted); else None."""
    path, mode, flags = args
    if isinstance(path, int):
        return None
    if mode is not None:
        if "r" not in mode:
            return None
    elif flags & os.O_ACCMODE not in _READ_FLAGS:
        return None
    name = os.fsdecode(path)
    return None if name.endswith(_NOT_DATA) else os.path.abspath(name)


# Debugger, coverage, profiler and optimizer own ids 0, 1, 2 and 5; a test that runs
# cProfile on 3.12 needs 2 free, and hypothesis takes 3 when it is free.
_MONITOR_IDS = (4, 3)
_MONITOR_NAME = "devpool-select"
# sys.monitoring exists from 3.12 on; typed Any, since the type checker targets 3.10.
monitoring: Any = getattr(sys, "monitoring", None)
_calls: ModuleType | None
try:  # built on Python 3.11 unless the build had no compiler (setup.py)
    from devpool.select import _calls
except ImportError:
    _calls = None


class Watch(Protocol):
    def start(self) -> str:
        """Watch from now on; a reason when something took the hook while paused."""

    def stop(self) -> str:
        """Stop watching; a reason when something took the hook while watching."""

    def take(self) -> tuple[Codes, Codes]:
        """The code that ran since the last take, and the part of it an import ran."""


def watch_for_this_interpreter(wanted: Callable[[str], bool]) -> Watch | None:
    """The cheapest watch whose hook is free, or None when every hook is taken. wanted: a
    file name → whether its code matters (the project's); only Monitor makes use of it."""
    if monitoring is not None:
        for tool in _MONITOR_IDS:
            if monitoring.get_tool(tool) is None:
                return Monitor(tool, wanted)
    elif _calls is not None:
        return NativeHook()
    elif sys.getprofile() is None:
        return Profiler()
    if sys.gettrace() is None:
        return Tracer()
    return None


class Monitor:
    """sys.monitoring (PEP 669), with local events on the project's code objects only.

    Each project code object has PY_START and PY_RESUME events; the first one in a stretch
    disables its location until `take` restarts them all: a function called a million
    times costs one callback per test. Code outside the project (pytest's, the standard
    library's) has no events, so a restart costs it only the interpreter's version check.
    A module's code objects are armed as the module is executed (the audit event "exec",
    passed to `audit`), and those already loaded when the watch starts, from their
    functions and classes."""

    def __init__(self, tool: int, wanted: Callable[[str], bool]) -> None:
        events = monitoring.events
        self.tool = tool
        # A file name → whether its code is watched (the project's); called per module and
        # function armed, so a caller with many files passes a cached one (the recorder's).
        self.wanted = wanted
        self.events = events.PY_START | events.PY_RESUME
        self.codes: Codes = {}
        self.imported: Codes = {}
        self.armed: dict[int, CodeType] = {}  # by identity: a reloaded module's code too
        self.importing: list[CodeType] = []  # the module bodies running, innermost last
        self.on = False
        self._claim()
        for module in list(sys.modules.values()):
            filename = getattr(module, "__file__", None)
            if isinstance(filename, str) and self.wanted(filename):
                self._arm_reachable(vars(module).values(), set())

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
        for code in self.armed.values():  # freeing the id may have cleared them
            self._set(code, self.events)
        return True

    def _set(self, code: CodeType, events: int) -> None:
        with contextlib.suppress(ValueError):  # the id was freed: start() says so, claims it
            monitoring.set_local_events(self.tool, code, events)

    def _set_events(self, events: int) -> None:
        with contextlib.suppress(ValueError):
            monitoring.set_events(self.tool, events)

    def _arm(self, code: CodeType) -> None:
        """Arm a code object and every one nested in it (functions, classes, lambdas)."""
        stack = [code]
        while stack:
            code = stack.pop()
            if id(code) not in self.armed:
                self.armed[id(code)] = code
                self._set(code, self.events)
                stack.extend(c for c in code.co_consts if isinstance(c, CodeType))

    def _arm_reachable(self, values: Iterable[object], seen: set[int]) -> None:
        """Arm the code of the functions and classes among values (a loaded module's)."""
        for value in values:
            if id(value) in seen:
                continue
            seen.add(id(value))
            value = getattr(value, "__func__", value)  # classmethod, staticmethod, method
            code = getattr(value, "__code__", None)
            if isinstance(code, CodeType):
                if self.wanted(code.co_filename):
                    self._arm(code)
            elif isinstance(value, type):
                self._arm_reachable(vars(value).values(), seen)
            elif isinstance(value, property):
                self._arm_reachable([value.fget, value.fset, value.fdel], seen)

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        """The audit event "exec": a module body is about to run (an import, runpy, an exec
        of source). The owner adds it to its own audit hook: each hook costs on every event,
        and there are many (every id() call is one)."""
        if event != "exec" or not args or not isinstance(args[0], CodeType):
            return
        code = args[0]
        if code.co_name != MODULE:
            return
        if self.wanted(code.co_filename):
            self._arm(code)
        if not self.on:
            return
        # What the import runs counts for every later test, code that already ran in this
        # stretch too: it is armed again, and the import's end is watched (its return, or
        # the unwind of an exception).
        self.importing.append(code)
        monitoring.restart_events()
        events = monitoring.events
        local = self.events if id(code) in self.armed else 0
        self._set(code, local | events.PY_RETURN)
        self._set_events(events.PY_UNWIND)

    def _start(self, code: CodeType, offset: int) -> Any:
        if not self.on:
            return None  # reports and the time between tests: nobody's; stays armed
        self.codes[where(code)] = code
        if self.importing:
            self.imported[where(code)] = code
        if code.co_name != MODULE:  # a module body keeps its return event
            return monitoring.DISABLE  # this location, until restart_events()
        return None

    def _return(self, code: CodeType, offset: int, value: object) -> Any:
        self._ended(code)
        return None

    def _unwind(self, code: CodeType, offset: int, error: BaseException) -> Any:
        self._ended(code)  # every frame that an exception leaves while a module imports
        return None

    def _ended(self, code: CodeType) -> None:
        if not self.importing or self.importing[-1] is not code:
            return
        self.importing.pop()
        self._set(code, 0)
        if not self.importing:
            self._set_events(0)

    def start(self) -> str:
        self.on = True
        if self._claim():  # claimed again if something freed it since (stop() said so)
            return ""
        return "another tool took devpool's sys.monitoring tool id"

    def stop(self) -> str:
        self.on = False
        if monitoring.get_tool(self.tool) == _MONITOR_NAME:
            return ""
        return "something freed devpool's sys.monitoring tool id"

    def take(self) -> tuple[Codes, Codes]:
        # The next stretch sees each location again. Only the project's code has events,
        # so code elsewhere passes the interpreter's version check without work.
        monitoring.restart_events()
        taken = (self.codes, self.imported)
        self.codes, self.imported = {}, {}
        return taken


class NativeHook:
    """devpool's frame-evaluation hook (_calls.c): a pointer set per frame, nothing timed,
    every thread, and the interpreter's specialised instructions left on."""

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

    def take(self) -> tuple[Codes, Codes]:
        codes, imported = self.calls.take()
        return codes_of(codes), codes_of(imported)


class Profiler:
    """cProfile's C hook in the thread that installs it; a Python hook in later threads."""

    def __init__(self) -> None:
        self.profiler = cProfile.Profile(builtins=False)
        self.thread_codes: Codes = {}
        self.on = False
        threading.setprofile(self._thread)

    def _thread(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and self.on:
            self.thread_codes[where(frame.f_code)] = frame.f_code

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

    def take(self) -> tuple[Codes, Codes]:
        if self.on:
            self.profiler.disable()  # ends the open calls, so each has its callees
        stats = self.profiler.getstats()
        self.profiler.clear()
        if self.on:
            self.profiler.enable()
        entries = [entry for entry in stats if isinstance(entry.code, CodeType)]
        codes = codes_of(entry.code for entry in entries if isinstance(entry.code, CodeType))
        roots = [code for code in codes.values() if code.co_name == MODULE]
        imported: Codes = {}
        if roots:  # an import ran: follow its calls (built only then, they cost)
            calls = {
                where(entry.code): [sub.code for sub in entry.calls or ()]
                for entry in entries
                if isinstance(entry.code, CodeType)
            }
            imported = _reached(calls, roots)
        codes.update(self.thread_codes)
        self.thread_codes = {}
        return codes, imported


def _reached(calls: dict[Where, list[CodeType | str]], roots: list[CodeType]) -> Codes:
    """Everything the roots called, directly or not (a callee also called from elsewhere
    counts too: more is selected, never less)."""
    seen: Codes = {}
    stack = list(roots)
    while stack:
        code = stack.pop()
        if where(code) not in seen:
            seen[where(code)] = code
            stack.extend(sub for sub in calls.get(where(code), ()) if isinstance(sub, CodeType))
    return seen


class Tracer:
    """A Python trace function on 'call' events (no line events but in module code)."""

    def __init__(self) -> None:
        self.codes: Codes = {}
        self.imported: Codes = {}
        self.importing = 0
        self.on = False
        threading.settrace(self._trace)

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if not self.on:
            return None
        code = frame.f_code
        self.codes[where(code)] = code
        if self.importing:
            self.imported[where(code)] = code
        if code.co_name == MODULE:
            self.importing += 1
            self.imported[where(code)] = code
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

    def take(self) -> tuple[Codes, Codes]:
        taken = (self.codes, self.imported)
        self.codes, self.imported = {}, {}
        return taken
