#!/usr/bin/env python3
"""The layering of libbooster (docs/architecture.md, "Layers"), checked on its sources.

Every header and source under booster/include/booster and booster/src belongs to one layer; an
`#include "booster/..."` may name a header of its own layer or a lower one, never a higher one.
A file under booster/src/<component>/ may include the private headers of its own component only
(`"x.h"` relative includes resolved in its folder, and nothing of another component's src folder);
a plugin (plugins/<name>/) includes public booster/ headers and its own files only.

Usage: check_layers.py <repository root> | --self-test. Exit 0 when the layering holds; 1 with one line per
offending include (file, line, the include, both layers); 2 when a file is in no layer (a new
folder or top-level header must be given a layer here and in docs/architecture.md).
"""
import os
import re
import sys

# Layer of each component, lowest first. A component is a folder of booster/include/booster (and
# booster/src), or a top-level header's base name.
LAYERS = [
    ("foundation", ["export.h", "logging.h", "config.h", "did_you_mean.h", "device.h", "io"]),
    ("communication", ["dist"]),
    ("flat storage", ["core"]),
    ("model pieces", ["nn", "data"]),
    ("optimizers", ["optim", "lr_scheduler.h", "mixed_precision/grad_scaler.h", "mixed_precision/loss_scaling.h"]),
    ("checkpoint formats", ["checkpoint"]),
    ("wrappers", ["wrappers"]),
    ("parallelisms", ["parallel"]),
    ("facade", ["plugin.h", "plugin_loader.h", "booster.h", "auto_select.h", "estimate.h",
                "mixed_precision/precision.h"]),
]
# Sources whose header is elsewhere, and private headers of the top-level sources.
SOURCE_HEADER = {
    "booster_impl.h": "booster.h", "booster_lora.cpp": "booster.h", "booster_memory.cpp": "booster.h",
    "config_impl.h": "config.h", "config_text.h": "config.h", "config_text.cpp": "config.h",
    "options.cpp": "config.h", "number_text.h": "config.h",
    "lr_scheduler_util.h": "lr_scheduler.h", "lr_schedulers.cpp": "lr_scheduler.h",
    "bf16_speed.h": "mixed_precision/precision.h", "bf16_speed.cpp": "mixed_precision/precision.h",
}

RANK = {}
for i, (_, members) in enumerate(LAYERS):
    for m in members:
        RANK[m] = i


def key_of(rel):
    """The layer key of a path relative to booster/include/booster or booster/src."""
    parts = rel.split("/")
    if len(parts) == 1:
        name = SOURCE_HEADER.get(parts[0], re.sub(r"\.(cpp|h)$", ".h", parts[0]))
        return name
    stem = parts[0] + "/" + re.sub(r"\.(cpp|h)$", ".h", parts[-1])
    if len(parts) == 2 and stem in RANK:
        return stem
    if len(parts) == 2 and parts[0] == "mixed_precision" and parts[1] in SOURCE_HEADER:
        return SOURCE_HEADER[parts[1]]
    if parts[0] == "mixed_precision" and stem not in RANK:
        return stem  # a new mixed_precision header: give it a layer above
    return parts[0]


def main(root):
    problems, unplaced = [], []
    root = os.path.abspath(root)
    bases = [os.path.join(root, "booster", "include", "booster"), os.path.join(root, "booster", "src")]
    for base in bases:
        for dirpath, _, files in os.walk(base):
            for f in sorted(files):
                if not f.endswith((".h", ".cpp")):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, base)
                key = key_of(rel)
                if key not in RANK:
                    unplaced.append(f"{os.path.relpath(path, root)}: no layer for '{key}'")
                    continue
                component = rel.split("/")[0] if "/" in rel else ""
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                        if not m:
                            continue
                        inc = m.group(1)
                        where = f"{os.path.relpath(path, root)}:{n}"
                        if inc.startswith("booster/kernels/"):
                            continue  # the kernel libraries' public headers (kernels/*/include): below everything
                        if inc.startswith("booster/"):
                            ikey = key_of(inc[len("booster/"):])
                            if ikey not in RANK:
                                unplaced.append(f"{where}: includes {inc}: no layer for '{ikey}'")
                            elif RANK[ikey] > RANK[key]:
                                problems.append(f"{where}: includes {inc} ({LAYERS[RANK[ikey]][0]}) from "
                                                f"{LAYERS[RANK[key]][0]}")
                        elif base.endswith("src") and "/" in inc and not inc.startswith(component + "/"):
                            problems.append(f"{where}: includes {inc}, a private header outside {component or 'src'}/")
                        elif base.endswith("src"):
                            target = os.path.normpath(os.path.join(dirpath, inc))
                            own = os.path.join(base, component) if component else base
                            if (component and not target.startswith(own + os.sep)) or (not component and os.path.dirname(target) != base):
                                problems.append(f"{where}: includes {inc}, another component's private header")
    # Plugins: public headers of libbooster and their own folder, nothing else.
    plugins = os.path.join(root, "plugins")
    for dirpath, _, files in os.walk(plugins):
        for f in sorted(files):
            if not f.endswith((".h", ".cpp")):
                continue
            path = os.path.join(dirpath, f)
            own = os.path.join(plugins, os.path.relpath(path, plugins).split(os.sep)[0])
            with open(path, encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if not m or m.group(1).startswith("booster/"):
                        continue
                    target = os.path.normpath(os.path.join(dirpath, m.group(1)))
                    if not target.startswith(own + os.sep) or not os.path.exists(target):
                        problems.append(f"{os.path.relpath(path, root)}:{n}: includes {m.group(1)}, which is "
                                        "neither a public booster/ header nor a file of this plugin")
    for line in unplaced:
        print(line)
    for line in problems:
        print(line)
    if unplaced:
        return 2
    if problems:
        return 1
    print(f"layering holds: {len(LAYERS)} layers, no include from a lower layer to a higher one")
    return 0


def self_test():
    """The checker on a made-up tree: a back-edge, a foreign private header, a stray plugin include."""
    import contextlib
    import io
    import tempfile
    files = {
        "booster/include/booster/dist/process_group.h": '#include "booster/export.h"\n',
        "booster/include/booster/core/flat_param.h": '#include "booster/dist/process_group.h"\n',
        "booster/src/dist/process_group.cpp": '#include "booster/core/flat_param.h"\n#include "impl.h"\n',
        "booster/src/dist/impl.h": "",
        "booster/src/core/flat_param.cpp": '#include "../dist/impl.h"\n',
        "plugins/p/p.cpp": '#include "p.h"\n#include "../q/q.h"\n',
        "plugins/p/p.h": "",
        "plugins/q/q.h": "",
    }
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "w") as fh:
                fh.write(text)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(tmp)
    lines = out.getvalue().splitlines()
    expected = [
        "booster/src/dist/process_group.cpp:1: includes booster/core/flat_param.h (flat storage) from communication",
        "booster/src/core/flat_param.cpp:1: includes ../dist/impl.h, a private header outside core/",
        "plugins/p/p.cpp:2: includes ../q/q.h, which is neither a public booster/ header nor a file of this plugin",
    ]
    if rc != 1 or sorted(lines) != sorted(expected):
        print("self-test FAILED: rc", rc, "output:", *lines, sep="\n  ")
        return 1
    print("self-test: the three planted violations are reported, and nothing else")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        sys.exit(self_test())
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
