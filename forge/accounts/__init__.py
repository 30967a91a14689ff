"""Who may sign in and act: people and bots (`accounts`), browser sessions (`websessions`),
personal access tokens (`tokens`), personal model keys (`model_keys`), the first admin
(`bootstrap`) and their generated password (`initial_password`)."""
