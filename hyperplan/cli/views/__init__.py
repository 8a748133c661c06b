"""What the `hyperplan` commands print: each view is a Rich renderable built from an API answer.

Commands hand a view to the console and never format by hand; tests render views into a fixed-width
console and compare the text (tests/cli/golden/). Each command imports its view inside itself, so
that `hyperplan --help` does not pay for building every view class.
"""
