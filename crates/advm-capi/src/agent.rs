//! The merge agent's start: `advm run --mode merge` puts libadvm.so in `LD_PRELOAD`
//! with `ADVM_MERGE_AGENT` set, and this constructor starts the agent thread
//! (`advm::merge::agent`) before the program's `main`. Without the variable it does
//! nothing, so programs that link libadvm.so for its C API are unaffected.

extern "C" fn start_merge_agent() {
    // Never unwind into the loader.
    let _ = std::panic::catch_unwind(advm::merge::agent::start_from_env);
}

/// Run by the dynamic loader when the library is loaded.
#[used]
#[link_section = ".init_array"]
static START_MERGE_AGENT: extern "C" fn() = start_merge_agent;
