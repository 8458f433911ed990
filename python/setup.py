"""setup.py — builds the nvheap Python package (see README.md here).

The extension nvheap._nvheap is compiled on CPython's limited API (abi3,
3.8 and later) and linked with the nvheap library, found in this order:

1. NVHEAP_BUILD_DIR=DIR: the libnvheap.a of an existing CMake build (and
   the headers of the tree it was configured from); the test suite builds
   the package against its own build this way;
2. the nvheap source tree around this folder (a checkout): CMake builds the
   static library (target nvheap_static) in the setuptools build folder,
   with the project's own flags and source list, and the extension links it
   in, so the package needs no installed libnvheap at run time;
3. otherwise, or with NVHEAP_USE_PKGCONFIG=1: an installed libnvheap,
   through `pkg-config --cflags --libs nvheap`.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
LIMITED_API = "0x03080000"     # abi3 from CPython 3.8 on
ABI_TAG = "cp38"


def is_tree(d):
    return os.path.isfile(os.path.join(d, "include", "nvheap.h")) and \
        os.path.isfile(os.path.join(d, "CMakeLists.txt"))


BUILD_DIR = os.environ.get("NVHEAP_BUILD_DIR")
if BUILD_DIR:
    BUILD_DIR = os.path.abspath(BUILD_DIR)
    try:
        cache = open(os.path.join(BUILD_DIR, "CMakeCache.txt"), encoding="utf-8").read()
        SOURCE = re.search(r"^nvheap_SOURCE_DIR:STATIC=(.*)$", cache, re.M).group(1)
    except (OSError, AttributeError):
        sys.exit("nvheap: NVHEAP_BUILD_DIR=%s is not a CMake build of nvheap" % BUILD_DIR)
    MODE = "build"
elif is_tree(os.path.dirname(HERE)) and os.environ.get("NVHEAP_USE_PKGCONFIG") != "1":
    SOURCE = os.path.dirname(HERE)
    MODE = "tree"
else:
    SOURCE = None
    MODE = "pkg-config"


def tree_version():
    text = open(os.path.join(SOURCE, "include", "nvheap.h"), encoding="utf-8").read()
    return ".".join(re.search(r"#define NVH_VERSION_%s +(\d+)" % p, text).group(1)
                    for p in ("MAJOR", "MINOR", "PATCH"))


def pkgconfig(*args):
    try:
        out = subprocess.run(["pkg-config", *args, "nvheap"], check=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True).stdout
    except FileNotFoundError:
        sys.exit("nvheap: pkg-config not found (Debian: apt-get install pkg-config)")
    except subprocess.CalledProcessError as e:
        sys.exit("nvheap: no nvheap source tree around %s, and pkg-config finds no "
                 "installed libnvheap:\n%s" % (HERE, e.stderr.strip()))
    return shlex.split(out)


class BuildExt(build_ext):
    """Builds (or finds) libnvheap before the extension, as this file's
    docstring says."""

    def build_extension(self, ext):
        if MODE == "pkg-config":
            flags = pkgconfig("--cflags", "--libs")
            ext.include_dirs += [f[2:] for f in flags if f.startswith("-I")]
            ext.library_dirs += [f[2:] for f in flags if f.startswith("-L")]
            ext.libraries += [f[2:] for f in flags if f.startswith("-l")]
            ext.extra_compile_args += [f for f in flags if not f.startswith(("-I", "-L", "-l"))]
        else:
            ext.include_dirs.append(os.path.join(SOURCE, "include"))
            ext.extra_objects.append(self.static_library())
        # The library may have changed while the extension's own sources did
        # not: always relink (it is one file).
        self.force = True
        super().build_extension(ext)

    def static_library(self):
        if MODE == "build":
            lib = os.path.join(BUILD_DIR, "libnvheap.a")
            if not os.path.isfile(lib):
                sys.exit("nvheap: %s is missing (cmake --build %s --target nvheap_static)"
                         % (lib, BUILD_DIR))
            return lib
        cmake = shutil.which("cmake")
        if not cmake:
            sys.exit("nvheap: building from the source tree needs CMake 3.18 or later "
                     "(Debian: apt-get install cmake build-essential)")
        build = os.path.abspath(os.path.join(self.build_temp, "libnvheap"))
        if not os.path.isfile(os.path.join(build, "CMakeCache.txt")):
            configure = [cmake, "-S", SOURCE, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                         "-DNVHEAP_BUILD_TESTS=OFF", "-DNVHEAP_BUILD_BENCH=OFF"]
            if shutil.which("ninja"):
                configure += ["-G", "Ninja"]
            subprocess.run(configure, check=True)
        jobs = str(self.parallel or os.cpu_count() or 1)
        subprocess.run([cmake, "--build", build, "--target", "nvheap_static", "-j", jobs],
                       check=True)
        return os.path.join(build, "libnvheap.a")


ext = Extension(
    "nvheap._nvheap",
    sources=["nvheap/_nvheap.c"],
    define_macros=[("Py_LIMITED_API", LIMITED_API)],
    py_limited_api=True,
    extra_compile_args=["-std=c11", "-Wall", "-Wextra"],
    # Export PyInit__nvheap only: the library linked in stays private, so it
    # cannot clash with a libnvheap.so that the same process loads.
    extra_link_args=["-pthread", "-Wl,--version-script=" + os.path.join(HERE, "nvheap.map")],
)

if MODE == "pkg-config":
    version = pkgconfig("--modversion")[0] if shutil.which("pkg-config") else "0"
else:
    version = tree_version()

setup(
    version=version,
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExt},
    options={"bdist_wheel": {"py_limited_api": ABI_TAG}},
)
