#include "common.h"

#include <sstream>

namespace horovod {

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::UINT8: return "uint8";
    case DataType::INT8: return "int8";
    case DataType::UINT16: return "uint16";
    case DataType::INT16: return "int16";
    case DataType::INT32: return "int32";
    case DataType::INT64: return "int64";
    case DataType::FLOAT16: return "float16";
    case DataType::FLOAT32: return "float32";
    case DataType::FLOAT64: return "float64";
    case DataType::BOOL: return "bool";
    case DataType::BFLOAT16: return "bfloat16";
  }
  return "unknown";
}

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::UINT8: case DataType::INT8: case DataType::BOOL: return 1;
    case DataType::UINT16: case DataType::INT16: case DataType::FLOAT16: case DataType::BFLOAT16: return 2;
    case DataType::INT32: case DataType::FLOAT32: return 4;
    case DataType::INT64: case DataType::FLOAT64: return 8;
  }
  return 0;
}

const char* OpTypeName(OpType type) {
  switch (type) {
    case OpType::ALLREDUCE: return "ALLREDUCE";
    case OpType::ALLGATHER: return "ALLGATHER";
    case OpType::BROADCAST: return "BROADCAST";
    case OpType::JOIN: return "JOIN";
    case OpType::ADASUM: return "ADASUM";
    case OpType::ALLTOALL: return "ALLTOALL";
    case OpType::BARRIER: return "BARRIER";
    case OpType::REDUCESCATTER: return "REDUCESCATTER";
    case OpType::ERROR: return "ERROR";
    case OpType::REDUCE: return "REDUCE";
    case OpType::ADD_PROCESS_SET: return "ADD_PROCESS_SET";
    case OpType::REMOVE_PROCESS_SET: return "REMOVE_PROCESS_SET";
  }
  return "UNKNOWN";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::AVERAGE: return "Average";
    case ReduceOp::SUM: return "Sum";
    case ReduceOp::ADASUM: return "Adasum";
    case ReduceOp::MIN: return "Min";
    case ReduceOp::MAX: return "Max";
    case ReduceOp::PRODUCT: return "Product";
  }
  return "Unknown";
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace horovod
