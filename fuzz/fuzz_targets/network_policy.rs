//! NetworkPolicy documents (`nsfast policy apply -f`): YAML or JSON, one or more objects.
//! What parses is written back as JSON (as `policy list -j` does) and reads again as the same
//! policies.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nsfast_policy::parse;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(objects) = parse(text) {
        let back: Vec<_> = objects.iter().map(|p| &p.object).collect();
        let json = serde_json::to_string(&back).expect("objects serialise");
        let again = parse(&json).expect("written objects read");
        assert_eq!(again, objects);
    }
});
