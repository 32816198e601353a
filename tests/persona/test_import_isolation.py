"""The persona core imports and works with Celery and Redis unimportable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_SCRIPT = r"""
import importlib.abc, json, sys

BLOCKED = ("celery", "redis", "kombu")

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked for this test")
        return None

sys.meta_path.insert(0, Blocker())
for name in BLOCKED:
    assert name not in sys.modules

import workers.persona
from workers.persona import compose_soul, memory_tool

home = sys.argv[1]
result = memory_tool(home, notes=True).execute({"action": "add", "text": "no broker needed"})
soul, found = compose_soul(home, memory_index_cap=True)
print(json.dumps({
    "result": [result.output, result.is_error],
    "soul": soul,
    "found": found,
    "loaded": sorted(name for name in sys.modules if name.split(".")[0] in BLOCKED),
}))
"""


def test_core_works_without_celery_or_redis(tmp_path: Path) -> None:
    """workers.persona imports, composes and writes memory while celery/redis cannot import."""
    (tmp_path / "SOUL.md").write_text("You are Kestrel.")
    # The blocker itself must bite: importing redis in that interpreter fails.
    blocker_only = _SCRIPT.partition("import workers.persona")[0]
    probe = subprocess.run(
        [sys.executable, "-c", blocker_only + "import redis"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert probe.returncode != 0
    assert "redis is blocked" in probe.stderr

    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["result"][1] is False
    assert report["found"] == ["SOUL.md", "MEMORY.md"]
    assert report["soul"] == "## SOUL.md\n\nYou are Kestrel.\n\n## MEMORY.md\n\n- no broker needed"
    assert report["loaded"] == []


_SHADOWING = """
import importlib, pkgutil, types
import workers.persona as package
for info in pkgutil.iter_modules(package.__path__):
    importlib.import_module(f"workers.persona.{info.name}")
exported = {name: getattr(package, name) for name in package.__all__}
print(",".join(name for name, value in exported.items() if isinstance(value, types.ModuleType)))
"""


def test_no_exported_name_is_shadowed_by_a_submodule() -> None:
    """Every name `workers.persona` exports is what its docs say (a function, a class), even
    after every submodule was imported: a submodule named like an export (``run``,
    ``dreamer`` were) replaces the package attribute, and `from workers.persona import run`
    then returned a module, depending on import order."""
    done = subprocess.run(
        [sys.executable, "-c", _SHADOWING], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == ""
