//! nsfast-cni's input: the `CNI_*` environment and the network configuration on stdin.
//! Input: `NAME=VALUE` lines (the environment), a NUL byte, then stdin.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nsfast_cni::plugin;
use nsfast_cni::spec::Env;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let (env_part, stdin) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    // std::env::var reports a non-UTF-8 variable as unset; so does this.
    let vars: Vec<(&str, &str)> = env_part
        .split(|&b| b == b'\n')
        .filter_map(|l| std::str::from_utf8(l).ok()?.split_once('='))
        .collect();
    let env = Env::from_lookup(|k| {
        vars.iter()
            .rev()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    });
    let res = match env.command.as_deref() {
        // These would change the host: run every check they make first, nothing else.
        Some("ADD" | "DEL" | "CHECK" | "STATUS" | "GC") => {
            plugin::check_input(&env, stdin).map(|()| None)
        }
        // VERSION, unknown or missing commands: the real entry point, which changes nothing.
        _ => plugin::run(&env, stdin),
    };
    match res {
        Ok(Some(out)) => {
            let v: Value = serde_json::from_str(&out).expect("a result is JSON");
            assert!(v["cniVersion"].is_string(), "{out}");
        }
        Ok(None) => {}
        Err(e) => {
            // The error object the runtime reads is always valid JSON with a code.
            let v: Value = serde_json::from_str(&e.to_json()).expect("an error is JSON");
            assert!(v["code"].is_u64() && v["msg"].is_string(), "{v}");
        }
    }
});
