"""The one import package the distribution installs, `gpuyard`: the repository's `gpuyard/` (the client and the
CLI), and its `services/` and `shared/` folders as `gpuyard.services` and `gpuyard.shared` (editable installs
included: setuptools maps them). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

MAPPED = {"gpuyard.services": "services", "gpuyard.shared": "shared"}

packages = ["gpuyard", *find_packages(include=["gpuyard.*"])]
for name, folder in MAPPED.items():
    packages += [name + found[len(folder) :] for found in find_packages(include=[folder, f"{folder}.*"])]

setup(packages=packages, package_dir={"gpuyard": "gpuyard", **MAPPED})
