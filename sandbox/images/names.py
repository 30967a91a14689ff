"""The image names and versions, in a module of their own that imports nothing: `forgehand sandbox
--help` shows them without loading the Docker SDK. The recipes they version are in sandbox_image.py
and agents_image.py."""

# Bump when any recipe text in sandbox_image.py changes: the build is skipped only for an image with this label.
IMAGE_VERSION = "2"
IMAGE_REPOSITORY = "forgehand-sandbox"
DEFAULT_IMAGE = f"{IMAGE_REPOSITORY}:{IMAGE_VERSION}"

# Bump when the recipe in agents_image.py or a file in agent_files.py changes.
AGENTS_IMAGE_VERSION = "6"
AGENTS_IMAGE_REPOSITORY = "forgehand-sandbox-agents"
DEFAULT_AGENTS_IMAGE = f"{AGENTS_IMAGE_REPOSITORY}:{AGENTS_IMAGE_VERSION}"
