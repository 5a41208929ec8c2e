"""SIGTERM (`timeout`, a job's end) ends a command as Ctrl-C does, what it was writing removed on
the way out, then the process as the signal ends it: a killed `fixtures export` or `synth` left
its hidden partial folder (copied weights and all) beside the output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

WRITER = textwrap.dedent("""
    import sys, time
    from stepper.weights import synth_checkpoint
    write = synth_checkpoint._write

    def written_then_waiting(*args, **kwargs):
        write(*args, **kwargs)
        print("written", flush=True)
        time.sleep(600)  # ended by the signal, not by this

    synth_checkpoint._write = written_then_waiting
    sys.argv = ["stepper", "synth", "--out", sys.argv[1]]
    from stepper.cli.main import main
    main()
""")


def test_sigterm_removes_the_partial_folder_and_ends_as_the_signal_does(tmp_path: Path):
    out = tmp_path / "synth"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "80"})
    try:
        assert proc.stdout.readline() == "written\n", proc.stderr.read()
        partial = [p.name for p in tmp_path.iterdir()]
        assert len(partial) == 1 and partial[0].startswith(".synth"), partial  # the checkpoint, not yet in place
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM and err == ""
    assert list(tmp_path.iterdir()) == []  # no partial folder, no output
