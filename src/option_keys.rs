//! What every table of option keys shares (the load options' and the generation options'):
//! how one key's spellings compare, the nearest known key to a misspelt one, and the doc
//! comments of the TypeScript interfaces generated from the tables.

/// A camelCase `name` as lowercase words joined by `sep` (`kvCache` → `kv_cache`, `kv-cache`).
pub fn words(name: &str, sep: char) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push(sep);
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// `s` without case, `_` or `-`: the form every spelling of a key shares (`kvCache`,
/// `kv_cache`, `--kv-cache` and `KV-CACHE` are one key).
pub fn normalized(s: &str) -> String {
    s.trim_start_matches('-')
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// A key of an options table: its name and the other names it is known by.
pub trait Named {
    /// The name as JavaScript writes it (camelCase).
    fn name(&self) -> &'static str;
    /// Other names accepted for it, beyond the snake_case and kebab-case forms of the name.
    fn aliases(&self) -> &'static [&'static str];

    /// The name and the aliases.
    fn forms(&self) -> impl Iterator<Item = &'static str> {
        std::iter::once(self.name()).chain(self.aliases().iter().copied())
    }
}

/// The key of `keys` that `spelled` names, in any of its spellings.
pub fn find<K: Named>(keys: &'static [K], spelled: &str) -> Option<&'static K> {
    let n = normalized(spelled);
    keys.iter().find(|k| k.forms().any(|f| normalized(f) == n))
}

/// The name of the key of `keys` whose spelling is nearest to `spelled` by edit distance over
/// the normalized forms, when it is near enough to be what was meant: at most a third of the
/// word's letters, and at least 2 (`kvCahce` → `kvCache`, not `name` → `kvCache`).
pub fn nearest<K: Named>(keys: &[K], spelled: &str) -> Option<&'static str> {
    let n = normalized(spelled);
    let mut best: Option<(usize, &'static str)> = None;
    for key in keys {
        for form in key.forms() {
            let d = strsim::damerau_levenshtein(&n, &normalized(form));
            if best.is_none_or(|(b, _)| d < b) {
                best = Some((d, key.name()));
            }
        }
    }
    best.filter(|(d, _)| *d <= (n.chars().count() / 3).max(2))
        .map(|(_, name)| name)
}

/// `text` as a TypeScript doc comment indented by `indent`, wrapped at 100 columns.
pub fn doc_comment(text: &str, indent: &str) -> String {
    let one = format!("{indent}/** {text} */\n");
    if one.len() <= 101 {
        return one;
    }
    let width = 100 - indent.len() - 3;
    let mut out = format!("{indent}/**\n");
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            out.push_str(&format!("{indent} * {line}\n"));
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&format!("{indent} * {line}\n{indent} */\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_meet_in_one_form() {
        assert_eq!(words("kvCacheBudget", '_'), "kv_cache_budget");
        for s in ["kvCache", "kv_cache", "--kv-cache", "KV-CACHE"] {
            assert_eq!(normalized(s), "kvcache", "{s}");
        }
        struct K(&'static str, &'static [&'static str]);
        impl Named for K {
            fn name(&self) -> &'static str {
                self.0
            }
            fn aliases(&self) -> &'static [&'static str] {
                self.1
            }
        }
        static KEYS: [K; 3] = [
            K("kvCache", &["cache_kind"]),
            K("name", &[]),
            K("topK", &[]),
        ];
        assert_eq!(nearest(&KEYS, "kvCahce"), Some("kvCache"));
        assert_eq!(nearest(&KEYS, "cache_knid"), Some("kvCache"));
        assert_eq!(nearest(&KEYS, "zzzzzzzz"), None);
        assert_eq!(find(&KEYS, "CACHE-KIND").map(|k| k.0), Some("kvCache"));
        assert_eq!(find(&KEYS, "--top-k").map(|k| k.0), Some("topK"));
        assert!(find(&KEYS, "top").is_none());
    }

    #[test]
    fn long_doc_comments_wrap_within_100_columns() {
        let text = "word ".repeat(60);
        let doc = doc_comment(text.trim(), "  ");
        assert!(doc.lines().all(|l| l.len() <= 100), "{doc}");
        assert!(doc.starts_with("  /**\n"));
        assert_eq!(doc_comment("short", ""), "/** short */\n");
    }
}
