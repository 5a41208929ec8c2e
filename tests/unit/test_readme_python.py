"""Every Python snippet of the README and of docs/*.md (README first: tests/helpers/docs.py) runs as
written, in order, in one namespace, from a folder that is not the repository (the examples work
from anywhere)."""

import re

from tests.helpers import docs


def snippets() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", docs.text(), re.MULTILINE | re.DOTALL)


def test_every_python_snippet_of_the_readme_runs(monkeypatch, tmp_path):
    found = snippets()
    assert len(found) >= 3
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for code in found:
        exec(compile(code, "README.md or docs/", "exec"), namespace)  # noqa: S102 - the docs' own examples
    assert namespace["run"].generated == (97,) and namespace["run"].names[:3] == [
        "prefill.embed", "prefill.rope_cos", "prefill.rope_sin"]
