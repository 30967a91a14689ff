"""The sandbox's images and their recipes: the plain sandbox image (`sandbox_image.py`), the agents
image on top of it (`agents_image.py`, with the files it adds in `agent_files.py` and the ACP
adapters in `acp_adapters.py`), what both builds share (`building.py`), and their names and
versions (`names.py`, importing nothing).

Building is blocking work on the host (Docker SDK, npm, debootstrap); nothing here starts a sandbox.
"""
