"""The forgehand host, in layers (each imports only those below it): `app` (composition),
`http` (requests in: REST and pages), `repos` (repositories and their use cases), `accounts`
(people, bots, sessions, tokens), `git` and `db` (on disk and in the database), `core` (the
kernel). docs/architecture/forge.md has the map."""
