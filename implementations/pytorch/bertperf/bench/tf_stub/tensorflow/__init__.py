"""A stand-in for the parts of TensorFlow 1.x that the MLCommons reference
`create_pretraining_data.py` and its `tokenization.py` use, so that `bench prep` can time the
reference script itself without TensorFlow. Flags and the app come from absl (pip install absl-py
six), files are read as TF's GFile reads them (lines split on "\\n" only), and the TFRecord writer
only counts the examples it is given: the reference's time here leaves out protobuf serialisation
and file writing, which real TensorFlow adds."""

import glob as _glob
import sys as _sys

from absl import app as _absl_app
from absl import flags  # noqa: F401 (tf.flags)


class app:  # noqa: N801 (tf.app)
    @staticmethod
    def run(main=None, argv=None):
        """tf.app.run(): the __main__ module's main() under absl's flag parsing."""
        _absl_app.run(main or _sys.modules["__main__"].main, argv)


class logging:  # noqa: N801 (tf.logging)
    INFO = 20

    @staticmethod
    def set_verbosity(level):
        pass

    @staticmethod
    def info(msg, *args):
        print(msg % args if args else msg, file=_sys.stderr)


class gfile:  # noqa: N801 (tf.gfile)
    @staticmethod
    def GFile(path, mode="r"):  # noqa: N802
        return open(path, mode, encoding="utf-8", newline="\n")

    @staticmethod
    def Glob(pattern):  # noqa: N802
        return _glob.glob(pattern)


class _Value:
    def __init__(self, value=()):
        self.value = list(value)


class train:  # noqa: N801 (tf.train)
    Int64List = FloatList = _Value

    class Feature:
        def __init__(self, int64_list=None, float_list=None):
            self.int64_list = int64_list or _Value()
            self.float_list = float_list or _Value()

    class Features:
        def __init__(self, feature=None):
            self.feature = feature

    class Example:
        def __init__(self, features=None):
            self.features = features

        def SerializeToString(self):  # noqa: N802
            return b""


class python_io:  # noqa: N801 (tf.python_io)
    class TFRecordWriter:
        def __init__(self, path):
            self.path, self.records = path, 0

        def write(self, record):
            self.records += 1

        def close(self):
            pass
