"""The names this module had before the composition root moved to hyperplan/app.py, for code that still
imports them from here."""

from __future__ import annotations

from hyperplan.app import AppConfig as RuntimeConfig
from hyperplan.app import Application as Runtime
from hyperplan.app import default_data_dir, read_fleet_text

__all__ = ["Runtime", "RuntimeConfig", "default_data_dir", "read_fleet_text"]
