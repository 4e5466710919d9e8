from aiops.cli import app

app(prog_name="aiops")
