"""``python -m recall_tasks`` is the ``recall-bench`` command."""

from recall_tasks.cli.app import console_main

console_main()
