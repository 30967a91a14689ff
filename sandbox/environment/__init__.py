"""A repository's declared environment: its declaration parsed and checked (`spec`), and the image
built from it once, then cached (`build`). Not used by tasks yet."""
