"""Sending what happened to the outside world: signed webhooks (see docs/WEBHOOKS.md)."""

from hyperplan.notify.dispatcher import Dispatcher, DispatcherConfig

__all__ = ["Dispatcher", "DispatcherConfig"]
