"""nntile-train's settings in one file (--train-config run.toml or run.json), as the flags
name them: the key of --tile-batch is tile_batch, of --precision precision. Tables group the
keys as --help does ([model], [tiling], [training], [evaluation], [data], [starpu]); the
command line overrides the file. --print-config writes a run's resolved settings in the same
form, to be read again."""
import argparse
import json
import os

from nntile.cli_common import CLIError

# what one invocation does, not the run
NOT_SETTINGS = ("help", "train_config", "print_config", "overwrite", "verbose", "no_progress")


def add_args(parser):
    """The flags that read and write these files."""
    parser.add_argument("--train-config", metavar="FILE", help="the settings in a TOML file "
                        "(JSON if FILE ends in .json), keyed and grouped as here (tile_batch "
                        "= 4 in [tiling]); flags override it")
    parser.add_argument("--print-config", action="store_true", help="write the run's "
                        "resolved settings as a --train-config file and exit")


def options(parser):
    """{key: (action, table)} of the parser's settings: each long flag's first name, with
    underscores, and the first word of its --help group."""
    found = {}
    for group in parser._action_groups:
        table = group.title.split()[0].lower()
        for action in group._group_actions:
            longs = [o for o in action.option_strings if o.startswith("--")]
            if longs and action.dest not in NOT_SETTINGS:
                found[longs[0][2:].replace("-", "_")] = (action, table)
    return found


def read(path, parser):
    """{dest: value} of a settings file, each value checked as its flag's would be."""
    where = f"--train-config {path}"
    if not os.path.isfile(path):  # a FIFO would block the read
        raise CLIError(f"{where}: " + ("not a regular file" if os.path.exists(path)
                                       else "no such file"))
    try:
        with open(path, "rb") as f:
            if path.endswith(".json"):
                data = json.load(f)
            else:
                import tomllib
                data = tomllib.load(f)
    except (OSError, ValueError, RecursionError) as exc:  # TOMLDecodeError is a ValueError
        raise CLIError(f"{where}: {exc}") from None
    if not isinstance(data, dict):
        raise CLIError(f"{where}: holds {type(data).__name__}, not a table of settings")
    known = options(parser)
    tables = {table for _, table in known.values()}
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict) and key in tables:
            flat.update(value)
        elif isinstance(value, dict):
            raise CLIError(f"{where}: unknown table [{key}] (tables: {', '.join(sorted(tables))})")
        else:
            flat[key] = value
    unknown = sorted(set(flat) - set(known))
    if unknown:
        raise CLIError(f"{where}: unknown keys {', '.join(unknown)}")
    return {known[key][0].dest: _checked(where, key, value, known[key][0])
            for key, value in flat.items()}


def _checked(where, key, value, action):
    if action.nargs == 0:  # --overwrite, --recompute/--no-recompute: true or false
        if not isinstance(value, bool):
            raise CLIError(f"{where}: {key} = {value!r} must be true or false")
        return value
    if isinstance(value, (bool, list, dict)) or (action.type is None and
                                                  not isinstance(value, str)):
        raise CLIError(f"{where}: {key} = {value!r} is not a " +
                       ("string" if action.type is None else "number"))
    try:
        value = action.type(str(value)) if action.type else value
    except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
        raise CLIError(f"{where}: {key} = {value!r}: {exc}") from None
    if action.choices is not None and value not in action.choices:
        raise CLIError(f"{where}: {key} = {value!r} is not one of "
                       f"{', '.join(map(str, action.choices))}")
    return value


def write(settings, parser):
    """TOML of {dest: value} (None left out), in the tables of read."""
    lines, last = [], None
    for key, (action, table) in sorted(options(parser).items(),
                                       key=lambda item: _order(parser, item[1][1])):
        value = settings.get(action.dest)
        if value is None:
            continue
        if table != last:
            lines.append(f"{'' if last is None else chr(10)}[{table}]")
            last = table
        lines.append(f"{key} = {_toml(value)}")
    return "\n".join(lines) + "\n"


def _order(parser, table):
    return [group.title.split()[0].lower() for group in parser._action_groups].index(table)


def _toml(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # 1e-08, inf: TOML's forms too
    return json.dumps(str(value), ensure_ascii=False)  # JSON's escapes are TOML's
