"""The root command's subcommands, each imported and built only when the command line names it.

Typer builds a Click command from every function's signature (type hints read, parameters converted) as
the program starts: for all of `hyperplan`'s groups, about a third of a client command's start-up, and
the command runs one of them. The root group's command table here holds a recipe per subcommand (module,
attribute, kind) and follows it on first use: `hyperplan plans list` imports and builds `plans` alone,
while `hyperplan --help`, a typo's suggestions and shell completion, which look at every name, build
what they ask for. Each command is built exactly as `Typer.add_typer` and `Typer.command` would have
built it, with the root's settings, so help, options and behaviour are the same.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import typer
from typer import _click as click
from typer.core import TyperCommand
from typer.main import get_command_from_info, get_group_from_info
from typer.models import CommandInfo, Default, TyperInfo


@dataclass(frozen=True)
class Later:
    """Where a subcommand is: `attribute` of `module`, a Typer (a group) or a function (a command, of
    Click class `cls` when given)."""

    module: str
    attribute: str
    cls: type[TyperCommand] | None = None

    def load(self) -> Any:
        return getattr(importlib.import_module(self.module), self.attribute)


@dataclass(frozen=True)
class Settings:
    """What the root Typer hands down to each command it builds."""

    pretty_exceptions_short: bool
    rich_markup_mode: Any
    suggest_commands: bool


def build(name: str, later: Later, settings: Settings) -> click.Command:
    """The Click command `Typer.add_typer(..., name=name)` (a group) or `Typer.command(name, cls=...)`
    would have made of `later`."""
    target = later.load()
    if isinstance(target, typer.Typer):
        return get_group_from_info(
            TyperInfo(target, name=name),
            pretty_exceptions_short=settings.pretty_exceptions_short,
            rich_markup_mode=settings.rich_markup_mode,
            suggest_commands=settings.suggest_commands,
        )
    return get_command_from_info(
        CommandInfo(name=name, cls=later.cls, callback=target, rich_help_panel=Default(None)),
        pretty_exceptions_short=settings.pretty_exceptions_short,
        rich_markup_mode=settings.rich_markup_mode,
    )


class Commands(MutableMapping[str, click.Command]):
    """A group's command table whose entries named in `later` are built on first read. Iteration gives
    every name, in `order` (names not in it after, as added), without building any."""

    def __init__(
        self,
        built: MutableMapping[str, click.Command],
        later: Mapping[str, Callable[[], click.Command]],
        order: list[str],
    ) -> None:
        self._built = dict(built)
        self._later = {name: make for name, make in later.items() if name not in self._built}
        known = [*self._built, *self._later]
        self._order = [name for name in order if name in known]
        self._order += [name for name in known if name not in self._order]

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._built:
            make = self._later.pop(name)  # KeyError for a name that is neither: no such command
            self._built[name] = make()
        return self._built[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._later.pop(name, None)
        self._built[name] = command
        if name not in self._order:
            self._order.append(name)

    def __delitem__(self, name: str) -> None:
        if self._built.pop(name, None) is None:
            del self._later[name]
        self._order.remove(name)

    def __contains__(self, name: object) -> bool:
        return name in self._built or name in self._later

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)


def lazy_commands(
    built: MutableMapping[str, click.Command], settings: Settings, later: dict[str, Later], order: list[str]
) -> Commands:
    """A root group's command table: `built` as they are, those in `later` built on first use; `order` is
    the order help lists every subcommand in."""
    makers = {name: partial(build, name, where, settings) for name, where in later.items()}
    return Commands(built, makers, order)
