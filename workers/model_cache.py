"""Models are built once per worker process and shared by its threads.

Building a provider client opens an HTTP connection pool; doing it per turn would throw the
pool away every time. A scripted model is rebuilt when its rules file changes, so editing a
persona's script takes effect on its next turn, like every other file in a persona home.
"""

from __future__ import annotations

import threading
from pathlib import Path

from workers.persona.models import Model
from workers.persona.models.config import ModelConfig
from workers.persona.models.spec import resolve_model

__all__ = ["ModelCache"]


class ModelCache:
    def __init__(self, config: ModelConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        # (spec, base dir for scripted specs) -> (rules file mtime, model)
        self._models: dict[tuple[str, str], tuple[int, Model]] = {}

    def get(self, spec: str | None, base_dir: Path) -> Model:
        effective = (spec or "").strip()
        if effective in ("", "inherit"):
            effective = self._config.default_spec
        scripted = effective.startswith("scripted:")
        key = (effective, str(base_dir) if scripted else "")
        version = _mtime(base_dir, effective.removeprefix("scripted:")) if scripted else 0
        with self._lock:
            cached = self._models.get(key)
            if cached is not None and cached[0] == version:
                return cached[1]
            model = resolve_model(effective, self._config, base_dir=base_dir)
            self._models[key] = (version, model)
            return model


def _mtime(base_dir: Path, path: str) -> int:
    candidate = Path(path)
    if not candidate.is_absolute():
        candidate = base_dir / candidate
    try:
        return candidate.stat().st_mtime_ns
    except OSError:
        return 0
