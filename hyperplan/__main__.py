from hyperplan.cli.main import app

app()
