"""Compiled artifacts: what a runner compiles, kept as content-addressed entries of a shared store.

- key.py: the artifact key, the sha256 of the canonical JSON of everything that changes the compiled graph (the
  model, the versions, the target, the runner's compiled shape);
- folder.py: folders that are complete or absent (built beside their place, a marker written last, renamed into
  place), used for the local artifacts folder, `fetch`'s model folders and the image scripts' caches;
- store.py: the store's entries (files + a manifest written last), the compile lease, the filesystem store;
- s3.py: the S3 store (boto3, imported only when one is opened);
- prepare.py: the serve / compile flow by `compile_cache.policy`, and the runners' entry, `prepare_artifacts`.

This package never imports torch, the server, the engine or the runners; nothing is imported here, so that each
module loads only what it needs.
"""
