"""commands: the commands beside `run`, each a module named as the command is; cli.py parses their
arguments and prints what they return (through console.py).

validate.py  a config checked against a sample of its data (gpu-prep validate)
init.py      a starter config for the data given (gpu-prep init)
inspect.py   samples as text, trained tokens marked (gpu-prep inspect)
stats.py     length percentiles, trained share, truncation; an HTML report (gpu-prep stats)
console.py   what every command prints: warnings, errors, a run's progress and summary, samples as text

`gpu-prep verify` is output/verify.py: the reader (gpu_prep.open(out, verify=True)) runs it too.
"""

# The modules themselves: cli.py imports each when its command runs, so one command loads no other's code
# (console.py, which prints for all of them, it imports at once).
__all__ = ["console", "init", "inspect", "stats", "validate"]
