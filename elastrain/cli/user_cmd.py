"""`elastrain user`: users, their API tokens and quotas (a thin layer over `elastrain.client`).

elastrain user create alice --expires-in-days 30      # admin: prints alice's first token
elastrain user whoami
elastrain user token create --name laptop --expires-in-days 90   # a token for yourself
elastrain user token list [alice]                      # an admin may name any user
elastrain user token revoke 7 [alice]                  # the token answers 401 from now on
elastrain user quota alice                             # limits and usage
elastrain user quota alice --clusters 5 --gpus 8       # admin: set (``default``: server default)
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from elastrain.cli.table import format_table
from elastrain.errors import ConfigError

if TYPE_CHECKING:
    from elastrain.client import Client

QUOTA_KINDS = ("clusters", "containers", "gpus")


def _limit(text: str) -> int | None:
    """A quota flag's value: a count >= 0, or ``default`` (None: back to the server default)."""
    if text == "default":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or 'default'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 or more, or 'default'")
    return value


def add_user_parser(sub: argparse._SubParsersAction, conn: argparse.ArgumentParser) -> None:
    """Register `elastrain user` with its `create`, `whoami`, `token` and `quota` commands."""
    user = sub.add_parser("user", help="manage users, their API tokens and quotas")
    usub = user.add_subparsers(dest="action", required=True, parser_class=type(user))
    p = usub.add_parser("create", parents=[conn], help="create a user and print their API token (admin)")
    p.add_argument("name")
    p.add_argument("--admin", action="store_true", help="the user may create users too")
    p.add_argument(
        "--expires-in-days", type=int, help="the first token expires after D days (default: never)"
    )
    usub.add_parser("whoami", parents=[conn], help="print the user the token belongs to")
    token = usub.add_parser("token", help="create, list and revoke API tokens")
    tsub = token.add_subparsers(dest="token_action", required=True, parser_class=type(token))
    p = tsub.add_parser("create", parents=[conn], help="create a token and print it (shown once)")
    p.add_argument("user", nargs="?", help="whose token (default: yourself; others: admin only)")
    p.add_argument("--name", default="token", help="a label to tell tokens apart (default: token)")
    p.add_argument("--expires-in-days", type=int, metavar="D", help="expire after D days (default: never)")
    p = tsub.add_parser("list", parents=[conn], help="list tokens (never the tokens themselves)")
    p.add_argument("user", nargs="?", help="whose tokens (default: yours)")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p = tsub.add_parser("revoke", parents=[conn], help="revoke a token: it answers 401 from now on")
    p.add_argument("token_id", type=int, metavar="ID", help="the token's id (elastrain user token list)")
    p.add_argument("user", nargs="?", help="whose token (default: yours)")
    p = usub.add_parser("quota", parents=[conn], help="show a user's quota and usage; set it (admin)")
    p.add_argument("name", metavar="USER")
    for kind in QUOTA_KINDS:
        p.add_argument(
            f"--{kind}",
            type=_limit,
            default=argparse.SUPPRESS,
            metavar="N|default",
            help=f"admin: the most {kind} the user may hold ('default': the server default)",
        )
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")


def run_user_command(client: Client, args: argparse.Namespace) -> int:
    """Run one `elastrain user` command."""
    if args.action == "whoami":
        me = client.me()
        print(f"{me['name']}{' (admin)' if me['admin'] else ''}")
        return 0
    if args.action == "create":
        token = client.create_user(args.name, admin=args.admin, token_expires_in_days=args.expires_in_days)
        print(f"user {args.name} created; token (shown once):", file=sys.stderr)
        print(token)
        return 0
    if args.action == "quota":
        return _quota(client, args)
    if args.action == "token":
        return _token(client, args)
    raise ConfigError(f"unknown user command {args.action!r}")


def _token(client: Client, args: argparse.Namespace) -> int:
    user = args.user or str(client.me()["name"])
    if args.token_action == "create":
        created = client.create_token(user, name=args.name, expires_in_days=args.expires_in_days)
        expires = _when(created.get("expires_at"), "never")
        print(
            f"token {created['id']} ({created['name']}) of {user}, expires {expires}; shown once:",
            file=sys.stderr,
        )
        print(created["token"])
        return 0
    if args.token_action == "revoke":
        revoked = client.revoke_token(user, args.token_id)
        print(
            f"token {revoked['id']} ({revoked['name']}) of {user} revoked at {_when(revoked['revoked_at'])}"
        )
        return 0
    tokens = client.list_tokens(user)
    if args.output == "json":
        print(json.dumps(tokens, indent=2))
        return 0
    rows = [["ID", "NAME", "STATE", "CREATED", "EXPIRES", "REVOKED", "LAST USED"]]
    for t in tokens:
        rows.append(
            [
                str(t["id"]),
                t["name"] or "-",
                t["state"],
                _when(t["created_at"]),
                _when(t["expires_at"], "never"),
                _when(t["revoked_at"]),
                _when(t["last_used_at"]),
            ]
        )
    print(format_table(rows) if tokens else f"user {user} has no tokens")
    return 0


def _quota(client: Client, args: argparse.Namespace) -> int:
    limits = {kind: getattr(args, kind) for kind in QUOTA_KINDS if hasattr(args, kind)}
    user = client.set_quota(args.name, limits) if limits else client.get_user(args.name)
    if args.output == "json":
        print(json.dumps(user, indent=2))
        return 0
    print(f"user {user['name']}{' (admin: not held to quotas)' if user['quota_exempt'] else ''}")
    rows = [["", "USED", "LIMIT", "SOURCE"]]
    for kind in QUOTA_KINDS:
        limit = user["quota"][kind]
        source = "server default" if user["quota_overrides"][kind] is None else "set for the user"
        rows.append([kind, str(user["usage"][kind]), "unlimited" if limit is None else str(limit), source])
    print(format_table(rows))
    return 0


def _when(value: Any, missing: str = "-") -> str:
    """An API timestamp as ``YYYY-MM-DD HH:MM:SSZ`` (UTC), or `missing`."""
    if not value:
        return missing
    return str(value)[:19].replace("T", " ") + "Z"
