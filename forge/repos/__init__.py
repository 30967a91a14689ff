"""Repositories as rows and their use cases: finding and loading one through the access rule
(`repositories`), their life in the database and on disk (`lifecycle`), who has a role on them
(`collaborators`), branch protection (`branch_rules`) and the record of every push (`pushes`).
Pull requests and issues join here, one subpackage each."""
