"""The project's images built here, offline: no registry pull, no network inside the build.

    PYTHONPATH=scripts python -m images.build [--push ADDRESS] [--oci-dir DIR] [TARGET ...]   # `make images`

* `images.tools`: buildah and mmdebstrap from Debian (apt-get, only when missing); buildah with its own storage
  under `$NEURONMODEL_CACHE/images/storage`, RUN steps under runc (through a wrapper that clamps oomScoreAdj);
* `images.base`: the base root filesystem, `mmdebstrap --variant=minbase bookworm` with Debian's python3, tagged
  as the FROM the Dockerfile names (`python:3.11-slim-bookworm`) in that private storage only;
* `images.wheelhouse`: every wheel a target installs, downloaded on the host (where the package registries are
  trusted) into `$NEURONMODEL_CACHE/images/wheelhouse-<target>-<digest>`, keyed by what decides its contents;
* `images.debhouse`: the Debian packages a target's build installs with apt (runtime-cpu: g++), downloaded on the
  host against the base's own dpkg status into a local apt repository, `$NEURONMODEL_CACHE/images/debhouse-*`;
* `images.build`: `buildah bud` of the Dockerfile's `operator` and `runtime-cpu` targets with the wheelhouse and
  the debhouse bind-mounted read-only (never a layer) and pip and apt pointed only at them; skipped when the image
  tagged for the target already carries the digest of its inputs; push to an OCI registry (plain http) or export
  an OCI archive.
"""
