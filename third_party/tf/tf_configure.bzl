"""Repository rule exposing the pip-installed TensorFlow to Bazel as @local_config_tf.

Reads TF_HEADER_DIR, TF_SHARED_LIBRARY_DIR and TF_SHARED_LIBRARY_NAME, which configure.py
writes into .bazelrc from tf.sysconfig (never hard-coded paths or ABI flags).
"""

_ENV = ["TF_HEADER_DIR", "TF_SHARED_LIBRARY_DIR", "TF_SHARED_LIBRARY_NAME"]

def _tf_local_config_impl(ctx):
    for name in _ENV:
        if not ctx.os.environ.get(name):
            fail("%s is not set: run `python configure.py` first" % name)
    lib_name = ctx.os.environ["TF_SHARED_LIBRARY_NAME"]
    ctx.symlink(ctx.os.environ["TF_HEADER_DIR"], "include")
    ctx.symlink(ctx.os.environ["TF_SHARED_LIBRARY_DIR"] + "/" + lib_name, lib_name)
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "tf_header_lib",
    hdrs = glob(["include/**/*"]),
    includes = ["include"],
)

cc_library(
    name = "libtensorflow_framework",
    srcs = ["{lib}"],
)
""".format(lib = lib_name))

tf_local_config = repository_rule(
    implementation = _tf_local_config_impl,
    environ = _ENV,
    local = True,
)
