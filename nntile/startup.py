"""Ctrl-C while a program starts. Its imports take a second or more, and Python's handler
would end one of them with a KeyboardInterrupt traceback. From the first line of nntile's
package until cli_common.run_cli takes over (a KeyboardInterrupt is then one line, exit code
130, and nntile-train's own handler later finishes the step and saves), SIGINT ends a
program at once, quietly, with the same exit code 130, as SIGTERM ends it quietly.
Only the programs: a script or a notebook that imports nntile keeps Python's handling."""
import os
import signal
import sys

INTERRUPTED = 128 + signal.SIGINT  # the shell's status of a command that Ctrl-C ended


def _exit_quietly(signum, frame):
    os._exit(INTERRUPTED)  # nothing to save or remove yet: the programs have not begun


def quiet_interrupt_while_starting():
    """Where this process runs a program (a console script nntile-*, or python -m
    nntile.<module>, whose package is imported while sys.argv[0] is still '-m') and SIGINT
    has Python's handler (not one ignored, as for a background job of a script)."""
    program = os.path.basename(sys.argv[0]).startswith("nntile-") or sys.argv[:1] == ["-m"]
    if program and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _exit_quietly)


def end_quiet_interrupt():
    """Python's handler again (a KeyboardInterrupt), where quiet_interrupt_while_starting
    replaced it."""
    if signal.getsignal(signal.SIGINT) is _exit_quietly:
        signal.signal(signal.SIGINT, signal.default_int_handler)
