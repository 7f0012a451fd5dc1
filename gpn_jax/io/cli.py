"""What every absl entry point shares: one-line errors with a non-zero exit.

An entry point declares its flags and one function, `body()`, that reads them and does the
work; `absl_entry(body, prog)` gives it `main(argv)` (for `app.run`) and `run()` (the console
script and `python -m`), so argument checks, log level and error handling live here once.
"""

import contextlib
import errno
import gc
import os
import re
import signal
import sys
import threading

from gpn_jax.io import config_args
from gpn_jax.io.errors import CheckpointError, TrainingError

# Errors a user can cause (bad input, config, workdir, the machine: every OSError, e.g. disk
# full, permission, a directory where a file belongs, a name too long); anything else is a bug
# and keeps its traceback.
USER_ERRORS = (
    ValueError,
    OSError,
    CheckpointError,
    TrainingError,
    KeyError,
)

# The fix named after an OS error of this errno (the rest: the error alone says enough).
_OS_FIXES = {
    errno.ENOSPC: "free some space or write elsewhere",
    errno.EFBIG: "the file exceeds the size this process or file system allows; raise the "
    "limit (ulimit -f) or write elsewhere",
    errno.EDQUOT: "the disk quota is used up; free some space or write elsewhere",
    errno.EACCES: "check the permissions or choose another path",
    errno.EPERM: "check the permissions or choose another path",
    errno.EROFS: "the file system is read-only; write elsewhere",
    errno.ENAMETOOLONG: "use a shorter path",
    errno.EISDIR: "give a file path, not a directory",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
}


INTERRUPTED = 128 + 2  # the shell's status for a command stopped by SIGINT
_COMMANDS = []  # the prog of each `run_or_exit` running now, innermost last


def run_or_exit(fn, *args, prog: str = "gpn_jax", **kwargs):
    """Calls `fn`; a user error prints `<prog>: error: <one line>` and exits with status 1.
    Ctrl-C (outside the trainer's steps, which save first) prints one line and exits at once
    with INTERRUPTED: no traceback, and no interpreter teardown racing XLA's compile threads."""
    _COMMANDS.append(prog)
    try:
        return fn(*args, **kwargs)
    except KeyboardInterrupt:
        _interrupted(prog)
    except USER_ERRORS as e:
        _exit(prog, error_line(e))
    except Exception as e:
        os_error = native_os_error(e)
        if os_error is None:
            raise
        _exit(prog, error_line(os_error))
    finally:
        _COMMANDS.pop()


def _interrupted(prog: str):
    print(f"{prog}: interrupted", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(INTERRUPTED)


@contextlib.contextmanager
def interrupt_exits_at_once():
    """In a command (`run_or_exit`): Ctrl-C during the block exits at once as it does outside
    the trainer's steps (one line, INTERRUPTED), also while the main thread is in native code.
    XLA's compile releases the GIL, but Python runs a signal's handler only when the call
    returns (a first compile: minutes); the signal's wakeup fd wakes a thread at once instead.
    The handlers stay as they are (SIGTERM still reaches the loop's); outside a command (a
    library call) the block runs as it is."""
    if not _COMMANDS or threading.current_thread() is not threading.main_thread():
        yield
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    watcher = threading.Thread(target=_watch, args=(read, _COMMANDS[-1]), daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(write)  # the watcher reads the end and returns
        watcher.join()
        os.close(read)


def _watch(fd: int, prog: str) -> None:
    """Reads the signal numbers written to the wakeup fd `fd`; exits on a SIGINT."""
    while numbers := os.read(fd, 64):
        if signal.SIGINT in numbers:
            _interrupted(prog)


_NATIVE_OS_ERROR = re.compile(r"(.*?):?\s*(?:I/O error: )?([^:()]*) \(os error (\d+)\)")


def native_os_error(e: BaseException) -> OSError | None:
    """The OSError inside a native library's error (safetensors, tensorstore: Rust and C++
    report one as `... <reason> (os error N)`), or None if `e` is not one."""
    m = _NATIVE_OS_ERROR.search(" ".join(str(e).split()))
    if not m:
        return None
    code = int(m.group(3))
    reason = m.group(2).strip() or os.strerror(code)
    where = m.group(1).strip()
    return OSError(code, f"{where}: {reason}" if where else reason)


def error_line(e: BaseException) -> str:
    """The one line a user error prints: an OSError as `<file>: <reason> (errno); <fix>`."""
    if isinstance(e, OSError) and e.errno is not None and (e.strerror or e.filename):
        names = [os.fsdecode(f) for f in (e.filename, e.filename2) if f is not None]
        where = f"{' -> '.join(names)}: " if names else ""
        name = errno.errorcode.get(e.errno, str(e.errno))
        fix = _OS_FIXES.get(e.errno)
        return f"{where}{e.strerror or name} ({name}){'; ' + fix if fix else ''}"
    return str(e) if str(e).strip() else type(e).__name__


def settle_heap() -> None:
    """For a command that has imported its stack (JAX, flax, orbax: millions of objects that
    live as long as the process): moves every object alive now out of the cyclic garbage
    collector's passes, and makes the passes rarer. Tracing and compiling allocate millions of
    short-lived objects, and every full pass otherwise walks the whole imported stack again: a
    few percent of a short run's CPU. Later garbage is still collected."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


# absl's help flags: True for every flag, False for the entry point's own.
_HELP_FLAGS = {"-h": False, "-?": False, "--help": False, "--helpshort": False, "--helpfull": True}


def help_requested(argv: list[str]) -> bool | None:
    """Whether `argv` (program first) asks for help: None if not, True for --helpfull."""
    for arg in argv[1:]:
        if arg == "--":
            break
        if arg in _HELP_FLAGS:
            return _HELP_FLAGS[arg]
    return None


def help_text(module: str, full: bool = False, config_help=None) -> str:
    """The help of the entry point defined in `module`: its docstring, then its own flags (or
    every flag and `config_help()`, the config's fields, `full`). absl's `--help` lists the
    flags of the module named like argv[0], which a console script (`gpn-train`) is not, so it
    listed none."""
    from absl import flags

    doc = (getattr(sys.modules.get(module), "__doc__", None) or "").strip()
    key = sys.argv[0] if module == "__main__" else module  # absl's name for `python -m`'s
    own = flags.FLAGS.get_help() if full else flags.FLAGS.module_help(key)
    fields = " and the config's fields" if config_help else ""
    more = f"\n\nTry --helpfull to list every flag (absl's and JAX's too){fields}."
    if full:
        more = f"\n\n{config_help()}" if config_help else ""
    return f"{doc}\n\nflags:\n{own.strip()}{more}\n"


def flags_parser(prog: str, module: str | None = None, config_help=None):
    """An absl `flags_parser` that turns a bad flag or unknown config field into one line;
    `--help` prints `help_text(module, ..., config_help)` and exits with status 0."""
    from absl import flags

    def parse(argv):
        full = help_requested(argv)
        if full is not None and module is not None:
            sys.stdout.write(help_text(module, full, config_help))
            sys.exit(0)
        names = config_args.config_flag_names(flags.FLAGS)
        for name in names:
            argv = config_args.resolve(argv, name)
            problem = config_args.check(argv, name)
            if problem:
                _exit(prog, problem)
        try:
            return flags.FLAGS(argv)
        except Exception as e:
            problem = next(filter(None, (config_args.load_error(argv, e, n) for n in names)), None)
            if problem:
                _exit(prog, problem)
            _flag_error(prog, argv, e)

    return parse


def _flag_error(prog: str, argv: list[str], e: Exception):
    """Exits with one line for a bad flag or unknown config field; re-raises anything else."""
    from absl import flags

    if isinstance(e, flags.Error):
        _exit(prog, str(e))
    if not isinstance(e, (AttributeError, KeyError, TypeError, ValueError)):
        raise e
    msg = str(e)
    key = re.search(r"'(\w+)", msg)
    key = key.group(1) if key else msg.strip("\"' ")
    culprit = [a for a in argv[1:] if key and key in a]
    where = f" in {culprit[-1]}" if culprit else ""
    hint = re.search(r'Did you mean "(\w+)"', msg)
    hint = f" (did you mean {hint.group(1)!r}?)" if hint else ""
    _exit(prog, f"unknown config field or bad value{where}: {key!r}{hint}")


def _exit(prog: str, msg: str):
    print(f"{prog}: error: {msg.strip().splitlines()[0]}", file=sys.stderr)
    sys.exit(1)


def config_or_exit(holder, prog: str):
    """The parsed config of a `DEFINE_config_file` flag; a file that failed to load is one line."""
    config = holder.value
    try:
        config.to_dict()  # a config that failed to load raises here, not at parse time
    except OSError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        detail = next((ln for ln in lines if "Errno" in ln or "Error" in ln), lines[-1])
        _exit(prog, f"cannot load config file: {detail}")
    return config


def absl_entry(body, prog: str, quiet: bool = True, config_help=None):
    """(main, run) of an entry point whose work is `body()` (which reads the parsed flags).

    `main(argv)` rejects stray positional arguments, makes stdout line-buffered, lowers absl
    logging (and XLA's C++ logging) to WARNING unless `--verbosity` was given (when `quiet`;
    JAX / orbax INFO lines would bury the progress output) and runs `body` through
    `run_or_exit`. `run()` is `app.run(main)` with this
    module's one-line flag errors; `config_help()`: the config's fields, which `--helpfull`
    lists.
    """
    from absl import app, flags, logging

    def main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        # Each line as it is written, also to a file (a job's log), not in blocks at exit.
        reconfigure = getattr(sys.stdout, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
        if quiet and not flags.FLAGS["verbosity"].present:
            logging.set_verbosity(logging.WARNING)
            # XLA's and the coordination service's C++ INFO lines ("Reached preemption sync
            # point") too, where JAX is not loaded yet (the level is read when it loads)
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        run_or_exit(body, prog=prog)  # nothing returned: absl would exit with it as status

    def run():
        app.run(main, flags_parser=flags_parser(prog, body.__module__, config_help))

    return main, run
