"""Packages are found, not listed by hand; the checkout's top-level profiles/ folder is shipped
as the data package gpusync.builtin_profiles (setup.cfg alone cannot map a folder under a
found package). Everything else is in setup.cfg."""
from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["gpusync", "gpusync.*"]), "gpusync.builtin_profiles"],
      package_dir={"gpusync.builtin_profiles": "profiles"})
