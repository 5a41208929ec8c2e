"""Every Python snippet of the README runs as written, in order, in one namespace, from a folder
that is not the repository (the README's examples work from anywhere)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def snippets() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)


def test_every_python_snippet_of_the_readme_runs(monkeypatch, tmp_path):
    found = snippets()
    assert len(found) >= 3
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for code in found:
        exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own examples
    assert namespace["run"].generated == (97,) and namespace["run"].names[:3] == [
        "prefill.embed", "prefill.rope_cos", "prefill.rope_sin"]
