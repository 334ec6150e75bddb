"""A stand-in for the parts of TensorFlow 1.x that the MLCommons reference
`create_pretraining_data.py` and its `tokenization.py` use, so that `bench prep` can time the
reference script itself without TensorFlow (pip install absl-py six protobuf google-crc32c; this
folder's parent on PYTHONPATH, as `bench prep --tf-stub tools/tf_stub` puts it):

  tf.flags, tf.app.run   absl's flags and app, as TensorFlow 1.x wraps them
  tf.logging             info lines on stderr
  tf.gfile               files read as TensorFlow's GFile reads them (lines split on "\\n" only)
  tf.train.Example ...   the real protocol buffers of tensorflow/core/example/{example,feature}.proto,
                         built from their definitions with the protobuf package
  tf.python_io.TFRecordWriter
                         real TFRecord files: per record its length (uint64, little-endian), the
                         masked crc32c of the length, the serialised Example, its masked crc32c

so the reference does the same work as under TensorFlow, serialisation and writing included.
"""

import glob as _glob
import struct as _struct
import sys as _sys

import google_crc32c as _crc32c
from absl import app as _absl_app
from absl import flags  # noqa: F401 (tf.flags)
from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf import descriptor_pool as _descriptor_pool
from google.protobuf import message_factory as _message_factory


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


def _example_messages():
    """tensorflow.Example, Features, Feature, BytesList, FloatList, Int64List (package
    "tensorflow", proto3, the field numbers of TensorFlow's .proto files)."""
    fd = _descriptor_pb2.FileDescriptorProto(name="tensorflow/core/example/example.proto",
                                             package="tensorflow", syntax="proto3")
    rep, opt = (_descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
                _descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    t = _descriptor_pb2.FieldDescriptorProto

    def message(name, *fields):
        m = fd.message_type.add(name=name)
        for fname, number, label, ftype, type_name in fields:
            f = m.field.add(name=fname, number=number, label=label, type=ftype)
            if type_name:
                f.type_name = type_name
        return m

    message("BytesList", ("value", 1, rep, t.TYPE_BYTES, None))
    message("FloatList", ("value", 1, rep, t.TYPE_FLOAT, None))
    message("Int64List", ("value", 1, rep, t.TYPE_INT64, None))
    feature = message("Feature", ("bytes_list", 1, opt, t.TYPE_MESSAGE, ".tensorflow.BytesList"),
                      ("float_list", 2, opt, t.TYPE_MESSAGE, ".tensorflow.FloatList"),
                      ("int64_list", 3, opt, t.TYPE_MESSAGE, ".tensorflow.Int64List"))
    feature.oneof_decl.add(name="kind")
    for f in feature.field:
        f.oneof_index = 0
    features = message("Features", ("feature", 1, rep, t.TYPE_MESSAGE,
                                    ".tensorflow.Features.FeatureEntry"))
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=opt, type=t.TYPE_STRING)
    entry.field.add(name="value", number=2, label=opt, type=t.TYPE_MESSAGE,
                    type_name=".tensorflow.Feature")
    message("Example", ("features", 1, opt, t.TYPE_MESSAGE, ".tensorflow.Features"))
    pool = _descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {m.name: _message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"tensorflow.{m.name}")) for m in fd.message_type}


_MESSAGES = _example_messages()


class train:  # noqa: N801 (tf.train)
    BytesList, FloatList, Int64List = (_MESSAGES["BytesList"], _MESSAGES["FloatList"],
                                       _MESSAGES["Int64List"])
    Feature, Features, Example = _MESSAGES["Feature"], _MESSAGES["Features"], _MESSAGES["Example"]


def _masked_crc(data: bytes) -> bytes:
    crc = _crc32c.value(data)
    return _struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


class python_io:  # noqa: N801 (tf.python_io)
    class TFRecordWriter:
        def __init__(self, path):
            self._file = open(path, "wb")

        def write(self, record):
            length = _struct.pack("<Q", len(record))
            self._file.write(length + _masked_crc(length) + record + _masked_crc(record))

        def close(self):
            self._file.close()
