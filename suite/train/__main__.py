"""``python -m suite.train``: the training bench without the suite's CLI; ``--worker``: the
child process that runs its jobs (suite.isolate)."""
import argparse
import sys

if sys.argv[1:] == ["--worker"]:
    from suite.isolate import serve
    from suite.train.worker import run_job

    serve(run_job)
else:
    from suite.train import __doc__ as doc
    from suite.train.cli import add_arguments, main

    parser = argparse.ArgumentParser(prog="python -m suite.train", description=doc.splitlines()[0])
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
