// Reference counts of a libtorch tensor, which tch does not expose: the device ring
// (device_ring.rs) reuses a device buffer only when nothing outside the ring refers to its
// tensors. Compiled against libtorch's headers by build.rs; only inline header code is used.
#include <ATen/core/TensorBody.h>

#include <cstdint>

// `tensor` is the `at::Tensor*` behind a tch tensor (torch-sys's `C_tensor`). Returns how many
// at::Tensor handles share its TensorImpl, and writes to `storage` how many TensorImpls share
// its storage (-1 for a tensor without one).
extern "C" int64_t trajstore_use_counts(const void* tensor, int64_t* storage) {
    const auto* t = static_cast<const at::Tensor*>(tensor);
    if (!t->defined()) {
        *storage = -1;
        return 0;
    }
    const c10::TensorImpl* impl = t->unsafeGetTensorImpl();
    *storage = impl->has_storage() ? static_cast<int64_t>(impl->unsafe_storage().use_count()) : -1;
    return static_cast<int64_t>(t->use_count());
}
