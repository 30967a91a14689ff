#!/bin/sh
# First start on an empty data directory: initdb with POSTGRES_USER as the superuser and
# POSTGRES_PASSWORD as its password (SCRAM), a database POSTGRES_DB, connections from other
# containers allowed with a password only. The set-up's last step writes a marker: a start that
# finds the data directory set up only in part (a set-up killed half-way) refuses to serve it.
# Then the server itself replaces this script (PID 1), without the password in its environment.
set -eu
marker="$PGDATA/.forgehand-initialised"

setup() {
  : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD (the database superuser password)}"
  user=${POSTGRES_USER:-postgres}
  db=${POSTGRES_DB:-$user}
  pwfile=$(mktemp)
  trap 'rm -f "$pwfile"' EXIT
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb --username="$user" --pwfile="$pwfile" --auth-local=scram-sha-256 --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA" >/dev/null
  rm -f "$pwfile"
  printf "listen_addresses = '*'\n" >> "$PGDATA/postgresql.conf"
  printf 'host all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
  if [ "$db" != postgres ]; then
    # The one-off server listens on its socket only, so nothing connects before it is ready.
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    PGPASSWORD=$POSTGRES_PASSWORD createdb --username="$user" --host=/var/run/postgresql "$db"
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
  touch "$marker"
  echo "forgehand-postgres: initialised $PGDATA (superuser $user, database $db)"
}

if [ "${1:-}" = postgres ]; then
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    setup
  elif [ ! -e "$marker" ]; then
    echo "forgehand-postgres: $PGDATA was set up only in part (a first start stopped half-way);" \
         "empty the volume and start again" >&2
    exit 1
  fi
  unset POSTGRES_PASSWORD
  shift
  exec postgres -D "$PGDATA" "$@"
fi
exec "$@"
