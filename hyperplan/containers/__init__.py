"""What training images need on a development host: a registry to push to and pull from, and images built
offline from Debian's packages.

- ``registry_dev.py``: ``scripts/registry-dev up|down|status DIR``, Debian's ``docker-registry`` (the CNCF
  distribution registry) on loopback, open or asking for a login (``up --login USER``).
- ``htpasswd.py``: that login's file, its bcrypt hash from the C library's ``crypt``.
- ``image_build.py``: ``scripts/image-dev build REGISTRY``, a small Python image (``mmdebstrap`` then
  ``podman import``), optionally with the SageMaker-style ``train`` (``sagemaker_train.py``), pushed.
- ``rootfs.py``: the root file systems ``mmdebstrap`` builds, cached by their package list.
- ``podman.py``: a Podman store of its own, and the containers.conf this host needs.
- ``host_tools.py``: Debian's packages installed when missing, and the processes a command marks.
- ``demo_runtime.py``: ``make run``'s runtime: the above set up for the demo fleet on first use (as root),
  then ``hyperplan serve`` with runtime podman, or process saying why.

This package may import nothing else of hyperplan but the leaf ``host_packages.py`` (apt-get, for the
host's side; docs/ARCHITECTURE.md, "Layers"): ``sagemaker_train.py`` runs inside the image, on Debian's
python3 and its standard library alone, where hyperplan is not.
"""
