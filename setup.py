"""Build hook of sparseclip_d2 (the metadata is in pyproject.toml).

A wheel (``pip install .``) carries the repository's ``configs/`` tree as
``sparseclip_d2/configs``, so configs are found by name once installed
(``sparseclip_d2.model_zoo.get_config_file("entmax_qq_l14")``), as detectron2's setup.py
does for its model-zoo configs. An editable install reads the checkout's ``configs/``.
"""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithConfigs(build_py):
    """``build_py`` that also copies ``configs/**/*.yaml`` into the built package."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        src = os.path.join(ROOT, "configs")
        dst = os.path.join(self.build_lib, "sparseclip_d2", "configs")
        for folder, _, files in os.walk(src):
            for name in files:
                if name.endswith(".yaml"):
                    rel = os.path.relpath(os.path.join(folder, name), src)
                    os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
                    shutil.copy2(os.path.join(folder, name), os.path.join(dst, rel))


setup(cmdclass={"build_py": BuildPyWithConfigs})
