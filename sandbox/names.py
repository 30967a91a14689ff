"""The image names and versions, in a module of their own that imports nothing: `forgehand sandbox
--help` shows them without loading the Docker SDK. The recipes they version are in image.py and
agents.py."""

# Bump when any recipe text in image.py changes: the build is skipped only for an image with this label.
IMAGE_VERSION = "2"
IMAGE_REPOSITORY = "forgehand-sandbox"
DEFAULT_IMAGE = f"{IMAGE_REPOSITORY}:{IMAGE_VERSION}"

# Bump when the recipe in agents.py or a script in agent_scripts.py changes.
AGENTS_IMAGE_VERSION = "6"
AGENTS_IMAGE_REPOSITORY = "forgehand-sandbox-agents"
DEFAULT_AGENTS_IMAGE = f"{AGENTS_IMAGE_REPOSITORY}:{AGENTS_IMAGE_VERSION}"
