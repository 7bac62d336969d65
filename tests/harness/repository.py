"""Model repositories of the bundled example models (models/<name>/config.pbtxt, weights from
models/generate_models.py, which copies them from its cache) for tests, benchmarks and the GPU
kit, with the config's dynamic_batching block kept, dropped or replaced."""
import os
import re
import shutil
import subprocess
import sys

# The checkout (or the GPU kit's src/): tests/harness/ is two folders below it.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "models")
KEEP = "keep"  # write_bundled's dynamic_batching: the config as committed


def bundled_names():
    """Every bundled model (a models/ folder with a config.pbtxt)."""
    return sorted(name for name in os.listdir(MODELS) if os.path.exists(os.path.join(MODELS, name, "config.pbtxt")))


def without_dynamic_batching(config):
    """`config` (config.pbtxt text) without its dynamic_batching block (the bundled configs have
    one; its fields are flat, so the block ends at its first closing brace)."""
    return re.sub(r"^dynamic_batching\s*\{[^}]*\}[ \t]*\n?", "", config, flags=re.M)


def write_bundled(root, names=None, dynamic_batching=KEEP):
    """The bundled models `names` (default: all) in the repository `root` (made if missing), and
    `root`. `dynamic_batching`: KEEP the committed block, None or "" for none (one request per
    execution), or a block's text ("dynamic_batching { max_queue_delay_microseconds: 2000 }")
    instead of the committed one."""
    names = list(names or bundled_names())
    os.makedirs(root, exist_ok=True)
    for name in names:
        os.makedirs(os.path.join(root, name), exist_ok=True)
        source = os.path.join(MODELS, name, "config.pbtxt")
        if dynamic_batching == KEEP:
            shutil.copyfile(source, os.path.join(root, name, "config.pbtxt"))
            continue
        with open(source) as f:
            config = without_dynamic_batching(f.read())
        if dynamic_batching:
            config += "\n" + dynamic_batching + "\n"
        with open(os.path.join(root, name, "config.pbtxt"), "w") as f:
            f.write(config)
    subprocess.run([sys.executable, os.path.join(MODELS, "generate_models.py"), "--repository", str(root),
                    "--models", *names], check=True, stdout=subprocess.DEVNULL)
    return root
