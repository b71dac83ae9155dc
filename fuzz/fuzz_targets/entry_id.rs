//! Dead-letter entry ids as the CLI and the API read them
//! (`tower_poison::EntryId`'s `FromStr`), and the CLI's `--kind` and the
//! configuration's `action` names.
//!
//! Input: the text given on the command line; the first 16 bytes also serve
//! as an id for a print/parse round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tower_classify::FailureKind;
use tower_poison::{Action, EntryId};

fuzz_target!(|data: &[u8]| {
    if data.len() >= 16 {
        let number = u128::from_le_bytes(data[..16].try_into().unwrap());
        let id: EntryId = format!("{number:032X}").parse().unwrap();
        let printed = id.to_string();
        assert_eq!(printed, format!("{number:032x}"));
        assert_eq!(printed.parse::<EntryId>(), Ok(id));
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(serde_json::from_str::<EntryId>(&json).unwrap(), id);
    }

    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Exactly 32 hex digits, either case, and nothing else.
    let well_formed = text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit());
    match text.parse::<EntryId>() {
        Ok(id) => {
            assert!(well_formed, "{text:?}");
            assert_eq!(id.to_string(), text.to_ascii_lowercase());
            let number = u128::from_str_radix(text, 16).unwrap();
            assert_eq!(id.to_string(), format!("{number:032x}"));
        }
        Err(error) => {
            assert!(!well_formed, "{text:?}");
            // The message names what was given.
            assert!(error.to_string().contains(&format!("{text:?}")));
        }
    }

    if let Ok(kind) = text.parse::<FailureKind>() {
        assert_eq!(kind.as_str(), text);
    }
    if let Ok(action) = text.parse::<Action>() {
        assert_eq!(action.to_string(), text);
    }
});
