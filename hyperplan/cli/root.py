"""The root command's group: its subcommands built when used (hyperplan/cli/lazy.py), listed by section
in help, and whatever stops a command printed as one line, without a traceback.

hyperplan/cli/main.py says which subcommands there are, in which sections and order (SECTIONS).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from typer import _click as click
from typer.core import TyperGroup

from hyperplan.cli.client import ApiError, Unreachable
from hyperplan.cli.common import Failure, refused, unreachable
from hyperplan.cli.lazy import Later, Settings, lazy_commands
from hyperplan.errors import HyperplanError, InternalFailure

OTHERS = "Other commands"


class Root(TyperGroup):
    """A root group; a subclass names its `later` subcommands, the `settings` they are built with and
    the `sections` help lists them in (title -> names, in order)."""

    later: ClassVar[Mapping[str, Later]] = {}
    settings: ClassVar[Settings]
    sections: ClassVar[Mapping[str, Sequence[str]]] = {}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        order = [name for names in self.sections.values() for name in names]
        self.commands = lazy_commands(self.commands, self.settings, dict(self.later), order)

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        """The root's own options refused as one line too (`hyperplan --bogus`), as a subcommand's are."""
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.exceptions.UsageError as exc:
            raise usage_failure(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        """Our error tree is a mistake in what the command was given, found before any request: one line
        `Code: message`, exit code 2; so is Click's refusal of a subcommand's options (`Error: ...`). A
        server's refusal or absence is one line too, exit code 1 (the commands report them already; this
        catches any they do not). Anything else is a bug, and its traceback is what a report of it needs."""
        try:
            return super().invoke(ctx)
        except InternalFailure:
            raise
        except click.exceptions.NoArgsIsHelpError:
            raise  # a group given no command: its help, as Click shows it
        except click.exceptions.UsageError as exc:  # a subcommand's options: one line, not Click's four
            raise usage_failure(exc) from None
        except HyperplanError as exc:
            raise Failure(exc.code, exc.message, exit_code=2) from None
        except ApiError as exc:
            raise refused(exc) from None
        except Unreachable as exc:
            raise unreachable(exc) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The subcommands under their sections' titles, in order, their names in one column."""
        shown = {
            name: command
            for name in self.list_commands(ctx)
            if (command := self.get_command(ctx, name)) is not None and not command.hidden
        }
        if not shown:
            return
        width = max(len(name) for name in shown)
        limit = formatter.width - 6 - width  # as Click's own list: three times its spacing
        placed = {name for names in self.sections.values() for name in names}
        sections = {**self.sections, OTHERS: [name for name in shown if name not in placed]}
        for title, names in sections.items():
            rows = [
                (name.ljust(width), shown[name].get_short_help_str(limit)) for name in names if name in shown
            ]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def usage_failure(exc: click.exceptions.UsageError) -> Failure:
    """Click's refusal of what a command was given, as one line that says where its help is."""
    message = exc.format_message().rstrip(".")
    where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
    return Failure("Error", message + where, exit_code=exc.exit_code)
