"""`serve`'s options and the value they become (cli/serve_options.ServeOptions) name the same things:
`ServeOptions(**locals())` is the command's first statement, so a parameter added to one and not the
other would fail only when `serve` runs."""

from __future__ import annotations

import dataclasses
import inspect

from hyperplan.cli import main
from hyperplan.cli.serve_options import ServeOptions


def test_every_serve_parameter_is_a_serve_options_field_and_no_more() -> None:
    parameters = list(inspect.signature(main.serve).parameters)
    assert parameters == [field.name for field in dataclasses.fields(ServeOptions)]
