"""``python -m veo_edge`` is the ``veo-edge`` command."""

from veo_edge.cli.main import main

main()
