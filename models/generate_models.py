#!/usr/bin/env python3
"""Writes the bundled example models: TorchScript files (models/mlp/1/model.pt,
models/convnet/1/model.pt, models/text_classifier/1/model.pt: strings in and out,
models/accumulator/1/model.pt: a stateful model for the sequence batcher; image_normaliser and
top_classes, the steps around convnet in the convnet_pipeline ensemble, whose version directory
is made too) and the mlp and
convnet networks as CPU AOTInductor packages with a dynamic batch (models/mlp_aoti/1/model.cpu.pt2,
models/convnet_aoti/1/model.cpu.pt2). The networks are in models/bundled_models.py.

The configs (config.pbtxt) are committed; the weights are not: they are made from a fixed seed,
so every machine serves the same numbers. Every model is built once per checkout into .cache at its
top (TorchScript files into .cache/models, packages into .cache/aoti: compiling one takes about a
minute on two cores) and copied from there; it is built again only when the torch version or the
source changes (a .stamp file beside each records both). A run that finds everything it needs
there does not import torch, so tests and benchmarks that write a repository of the bundled models
pay milliseconds, not the 2.5 s of importing torch. Run with the venv's python (scripts/setup.sh):

    .venv/bin/python models/generate_models.py [--repository DIR] [--force] [--models NAME ...]
"""
import argparse
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model_cache import cached, source_key  # noqa: E402

MODELS = ("mlp", "convnet", "text_classifier", "accumulator", "mlp_aoti", "convnet_aoti", "image_normaliser",
          "top_classes")
# Ensembles: a version directory and no file of their own (their steps are the models above).
ENSEMBLES = ("convnet_pipeline",)
CACHE = os.path.join(os.path.dirname(HERE), ".cache")


def cached_model(name, force=False):
    """The file of model `name` (model.pt, or model.cpu.pt2 for a package) in the cache, built
    there first when it is not there yet for this torch version and these sources. `force`
    builds it again whatever the cache holds."""
    sources = [os.path.join(HERE, "bundled_models.py")]
    if name.endswith("_aoti"):
        sources.append(os.path.join(HERE, "sluice_export.py"))
    key = source_key(*sources)
    if force:
        key += f"forced {os.getpid()}\n"

    def build_package(path):
        import bundled_models
        print(f"{name}: compiling the package (about a minute on two cores)", file=sys.stderr, flush=True)
        bundled_models.export(name, path)

    def build_script(path):
        import bundled_models
        bundled_models.build(name).save(path)

    if name.endswith("_aoti"):
        return cached(os.path.join(CACHE, "aoti"), f"{name}.cpu.pt2", key, build_package)
    return cached(os.path.join(CACHE, "models"), f"{name}.pt", key, build_script)


def cached_package(name, force=False):
    """The CPU package of `name` ("mlp_aoti" or "convnet_aoti") in .cache/aoti (see cached_model)."""
    return cached_model(name, force)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", default=HERE, help="model repository to write into")
    parser.add_argument("--force", action="store_true", help="build again and rewrite existing files")
    parser.add_argument("--models", nargs="+", choices=MODELS + ENSEMBLES, default=list(MODELS + ENSEMBLES),
                        help="which models to write (default: all)")
    args = parser.parse_args()
    for name in args.models:
        if name in ENSEMBLES:
            os.makedirs(os.path.join(args.repository, name, "1"), exist_ok=True)
            continue
        file_name = "model.cpu.pt2" if name.endswith("_aoti") else "model.pt"
        path = os.path.join(args.repository, name, "1", file_name)
        if os.path.exists(path) and not args.force and not name.endswith("_aoti"):
            print(f"{path}: present")
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.copyfile(cached_model(name, args.force), path)
        print(f"{path}: written")


if __name__ == "__main__":
    main()
