//! Raw JSON handling: objects whose values are kept as their exact text, so
//! `args`, `meta`, `result` and unknown fields round-trip with key order and
//! number text intact.

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

use crate::limits::JSON_DEPTH_MAX;

/// A JSON object as an ordered list of (key, raw value), borrowed from the
/// text it was parsed from (a key with escapes is the only copy). The first
/// of repeated keys wins when looked up.
#[derive(Debug, Default)]
pub struct RawObject<'a> {
    pub entries: Vec<(Cow<'a, str>, &'a RawValue)>,
}

impl<'a> RawObject<'a> {
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.entries.iter().find(|(name, _)| name == key).map(|(_, value)| *value)
    }

    /// Like `get`, but a JSON `null` counts as absent.
    pub fn get_present(&self, key: &str) -> Option<&'a RawValue> {
        self.get(key).filter(|value| value.get() != "null")
    }

    /// `get_present` for each of `keys`, in one pass over the entries.
    pub fn get_present_many<const N: usize>(&self, keys: &[&str; N]) -> [Option<&'a RawValue>; N] {
        let mut found: [Option<&'a RawValue>; N] = [None; N];
        let mut seen = [false; N];
        for (name, value) in &self.entries {
            if let Some(index) = keys.iter().position(|key| key == name)
                && !std::mem::replace(&mut seen[index], true)
            {
                found[index] = Some(*value).filter(|value| value.get() != "null");
            }
        }
        found
    }
}

/// An object key, borrowed unless it had escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(text)))
            }
            fn visit_str<E>(self, text: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(text.to_string())))
            }
            fn visit_string<E>(self, text: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(text)))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

impl<'de> Deserialize<'de> for RawObject<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = RawObject<'de>;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawObject<'de>, A::Error> {
                raw_object_of(map)
            }
        }
        deserializer.deserialize_map(ObjectVisitor)
    }
}

/// The entries of a map being read, values kept as their text.
fn raw_object_of<'de, A: MapAccess<'de>>(mut map: A) -> Result<RawObject<'de>, A::Error> {
    let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(8).min(16));
    while let Some((Key(key), value)) = map.next_entry::<Key<'de>, &'de RawValue>()? {
        entries.push((key, value));
    }
    Ok(RawObject { entries })
}

/// An element of an array that should hold objects: the object, or the
/// fact that it was some other value (read whole and dropped).
#[derive(Debug)]
pub enum ObjectElement<'a> {
    Object(RawObject<'a>),
    Other,
}

impl<'de> Deserialize<'de> for ObjectElement<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ElementVisitor;
        impl<'de> Visitor<'de> for ElementVisitor {
            type Value = ObjectElement<'de>;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ObjectElement<'de>, A::Error> {
                raw_object_of(map).map(ObjectElement::Object)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut sequence: A) -> Result<ObjectElement<'de>, A::Error> {
                while sequence.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(ObjectElement::Other)
            }
            fn visit_unit<E>(self) -> Result<ObjectElement<'de>, E> {
                Ok(ObjectElement::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<ObjectElement<'de>, E> {
                Ok(ObjectElement::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<ObjectElement<'de>, E> {
                Ok(ObjectElement::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<ObjectElement<'de>, E> {
                Ok(ObjectElement::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<ObjectElement<'de>, E> {
                Ok(ObjectElement::Other)
            }
            fn visit_str<E>(self, _: &str) -> Result<ObjectElement<'de>, E> {
                Ok(ObjectElement::Other)
            }
        }
        deserializer.deserialize_any(ElementVisitor)
    }
}

/// Why a body could not be read as a JSON object.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    Malformed(String),
    NotAnObject,
    TooDeep,
}

/// Parses a request body that must be a JSON object.
pub fn parse_object(bytes: &[u8]) -> Result<RawObject<'_>, BodyError> {
    let text = checked_text(bytes)?;
    serde_json::from_str::<RawObject>(text).map_err(classify)
}

/// Parses text that must be one JSON value and stands for a member of a
/// request body: it may nest one level less deeply than a body, which holds it.
pub fn parse_member_value(text: &str) -> Result<&RawValue, BodyError> {
    if nesting_depth(text.as_bytes()) >= JSON_DEPTH_MAX {
        return Err(BodyError::TooDeep);
    }
    serde_json::from_str::<&RawValue>(text).map_err(|error| BodyError::Malformed(error.to_string()))
}

/// A body's text once it is known not to nest too deeply and to be UTF-8.
fn checked_text(bytes: &[u8]) -> Result<&str, BodyError> {
    if nests_too_deep(bytes) {
        return Err(BodyError::TooDeep);
    }
    // One UTF-8 check of the whole body. Parsed from bytes, every raw value
    // kept was checked again, and the values of nested objects once more.
    std::str::from_utf8(bytes)
        .map_err(|error| BodyError::Malformed(format!("invalid UTF-8 at byte {} of the body", error.valid_up_to())))
}

/// A parse error of a body: not an object (the wrong type at the top), or
/// not JSON at all.
fn classify(error: serde_json::Error) -> BodyError {
    match error.classify() {
        serde_json::error::Category::Data => BodyError::NotAnObject,
        _ => BodyError::Malformed(error.to_string()),
    }
}

/// The first `key` member of a body object, when it should be an array of
/// `T` (raw values, or objects).
#[derive(Debug)]
pub enum ArrayMember<T> {
    /// Absent, or `null`.
    Missing,
    /// Present, but not an array.
    NotArray,
    /// An array of more elements than the bound: how many.
    TooMany(usize),
    /// The array's elements.
    Elements(Vec<T>),
}

/// Parses a body that must be a JSON object and splits its first `key`
/// member into its elements (at most `max` kept) in the same pass, checking
/// the other members as JSON and skipping them. A batch body is then read
/// once, not as a whole and again element by element.
pub fn parse_array_member<'a>(bytes: &'a [u8], key: &str, max: usize) -> Result<ArrayMember<&'a RawValue>, BodyError> {
    array_member_in_one_pass(bytes, key, max, |raw| raw)
}

/// [`parse_array_member`] for an array of objects, each read into a
/// [`RawObject`] in the same pass: not as a raw value first and then again
/// as an object.
pub fn parse_object_array_member<'a>(
    bytes: &'a [u8],
    key: &str,
    max: usize,
) -> Result<ArrayMember<ObjectElement<'a>>, BodyError> {
    array_member_in_one_pass(bytes, key, max, |raw| {
        parse_raw_object(raw).map_or(ObjectElement::Other, ObjectElement::Object)
    })
}

/// The one pass of [`parse_array_member`] with elements read as `T`;
/// `from_raw` makes one from a raw value when the body is read again.
fn array_member_in_one_pass<'a, T: Deserialize<'a>>(
    bytes: &'a [u8],
    key: &str,
    max: usize,
    from_raw: impl Fn(&'a RawValue) -> T,
) -> Result<ArrayMember<T>, BodyError> {
    struct Member<'k, T> {
        key: &'k str,
        max: usize,
        element: std::marker::PhantomData<T>,
    }
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Member<'_, T> {
        type Value = ArrayMember<T>;
        fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
            formatter.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ArrayMember<T>, A::Error> {
            let mut found = None;
            while let Some(Key(name)) = map.next_key::<Key<'de>>()? {
                if found.is_none() && name == self.key {
                    found = Some(map.next_value_seed(ArraySeed { max: self.max, element: std::marker::PhantomData })?);
                } else {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
            Ok(found.unwrap_or(ArrayMember::Missing))
        }
    }
    let text = checked_text(bytes)?;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let member = Member { key, max, element: std::marker::PhantomData };
    let one_pass = deserializer.deserialize_map(member).and_then(|member| {
        deserializer.end()?;
        Ok(member)
    });
    match one_pass.map_err(classify) {
        // The one pass decodes a scalar member or element, which refuses
        // what a mere scan of valid JSON accepts (a number past f64's range,
        // a lone surrogate escape): such a body is read again as raw values,
        // so it is judged as any other.
        Err(BodyError::Malformed(_)) => {
            Ok(match array_member_of(serde_json::from_str::<RawObject>(text).map_err(classify)?, key, max)? {
                ArrayMember::Missing => ArrayMember::Missing,
                ArrayMember::NotArray => ArrayMember::NotArray,
                ArrayMember::TooMany(count) => ArrayMember::TooMany(count),
                ArrayMember::Elements(raw) => ArrayMember::Elements(raw.into_iter().map(from_raw).collect()),
            })
        }
        other => other,
    }
}

/// The first `key` member of a parsed object, as [`ArrayMember`].
fn array_member_of<'a>(object: RawObject<'a>, key: &str, max: usize) -> Result<ArrayMember<&'a RawValue>, BodyError> {
    Ok(match object.get_present(key) {
        None => ArrayMember::Missing,
        Some(raw) => match raw_elements_at_most(raw, max) {
            None => ArrayMember::NotArray,
            Some(Ok(elements)) => ArrayMember::Elements(elements),
            Some(Err(count)) => ArrayMember::TooMany(count),
        },
    })
}

/// Reads a value that should be an array into [`ArrayMember`]; any other
/// value is read whole and reported, never an error.
struct ArraySeed<T> {
    max: usize,
    element: std::marker::PhantomData<T>,
}

impl<'de, T: Deserialize<'de>> serde::de::DeserializeSeed<'de> for ArraySeed<T> {
    type Value = ArrayMember<T>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<ArrayMember<T>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for ArraySeed<T> {
    type Value = ArrayMember<T>;
    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("any JSON value")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, sequence: A) -> Result<ArrayMember<T>, A::Error> {
        Ok(match elements_at_most(sequence, self.max)? {
            Ok(elements) => ArrayMember::Elements(elements),
            Err(count) => ArrayMember::TooMany(count),
        })
    }
    fn visit_unit<E>(self) -> Result<ArrayMember<T>, E> {
        Ok(ArrayMember::Missing)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ArrayMember<T>, A::Error> {
        while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
        Ok(ArrayMember::NotArray)
    }
    fn visit_bool<E>(self, _: bool) -> Result<ArrayMember<T>, E> {
        Ok(ArrayMember::NotArray)
    }
    fn visit_i64<E>(self, _: i64) -> Result<ArrayMember<T>, E> {
        Ok(ArrayMember::NotArray)
    }
    fn visit_u64<E>(self, _: u64) -> Result<ArrayMember<T>, E> {
        Ok(ArrayMember::NotArray)
    }
    fn visit_f64<E>(self, _: f64) -> Result<ArrayMember<T>, E> {
        Ok(ArrayMember::NotArray)
    }
    fn visit_str<E>(self, _: &str) -> Result<ArrayMember<T>, E> {
        Ok(ArrayMember::NotArray)
    }
}

/// The elements of a sequence, if it has at most `max`; otherwise
/// `Err(count)`, counted without keeping any element past `max`.
fn elements_at_most<'de, T: Deserialize<'de>, A: serde::de::SeqAccess<'de>>(
    mut sequence: A,
    max: usize,
) -> Result<Result<Vec<T>, usize>, A::Error> {
    let mut elements = Vec::new();
    while let Some(element) = sequence.next_element::<T>()? {
        elements.push(element);
        if elements.len() > max {
            let mut count = elements.len();
            drop(elements);
            while sequence.next_element::<serde::de::IgnoredAny>()?.is_some() {
                count += 1;
            }
            return Ok(Err(count));
        }
    }
    Ok(Ok(elements))
}

/// The elements of a JSON array as raw values, if it has at most `max`;
/// otherwise `Err(count)`, counted without keeping any element past `max`.
/// `None` when `raw` is not an array.
pub fn raw_elements_at_most(raw: &RawValue, max: usize) -> Option<Result<Vec<&RawValue>, usize>> {
    struct Bounded {
        max: usize,
    }
    impl<'de> Visitor<'de> for Bounded {
        type Value = Result<Vec<&'de RawValue>, usize>;

        fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
            formatter.write_str("an array")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, sequence: A) -> Result<Self::Value, A::Error> {
            elements_at_most(sequence, self.max)
        }
    }
    let mut deserializer = serde_json::Deserializer::from_str(raw.get());
    deserializer.deserialize_seq(Bounded { max }).ok()
}

/// Parses a raw value that must be an object.
pub fn parse_raw_object(raw: &RawValue) -> Option<RawObject<'_>> {
    serde_json::from_str::<RawObject>(raw.get()).ok()
}

/// Shallow merge; keys of `overlay` win and keep `base`'s position when they clash.
pub fn merge_objects(base: RawObject, overlay: RawObject) -> String {
    let mut entries: Vec<(String, String)> = Vec::new();
    for (key, value) in base.entries.into_iter().chain(overlay.entries) {
        let text = minify(value.get());
        match entries.iter_mut().find(|(existing, _)| *existing == key) {
            Some(entry) => entry.1 = text,
            None => entries.push((key.into_owned(), text)),
        }
    }
    let mut out = String::from("{");
    for (index, (key, text)) in entries.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        push_json_string(&mut out, key);
        out.push(':');
        out.push_str(text);
    }
    out.push('}');
    out
}

/// Whether `bytes` nests arrays and objects deeper than `JSON_DEPTH_MAX`.
pub fn nests_too_deep(bytes: &[u8]) -> bool {
    nesting_depth(bytes) > JSON_DEPTH_MAX
}

/// The text of a raw JSON string without escapes, borrowed; `None` for any
/// other value or a string with escapes (which need decoding).
pub fn plain_string(raw: &RawValue) -> Option<&str> {
    let text = raw.get();
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    // A raw value is valid JSON, so a string's only escapes start with `\`.
    (!inner.contains('\\')).then_some(inner)
}

/// A JSON string's text, borrowed when it has no escapes; `None` for any other value.
pub fn string_value(raw: &RawValue) -> Option<Cow<'_, str>> {
    match plain_string(raw) {
        Some(text) => Some(Cow::Borrowed(text)),
        None => serde_json::from_str::<String>(raw.get()).ok().map(Cow::Owned),
    }
}

/// The deepest nesting of arrays and objects in `bytes`, ignoring string
/// contents. Strings are skipped a quote or backslash at a time: a batch of
/// jobs is mostly string text, and a byte-at-a-time pass over it cost as
/// much as parsing it.
fn nesting_depth(bytes: &[u8]) -> usize {
    let mut depth = 0usize;
    let mut deepest = 0usize;
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'"' => {
                index = string_end(bytes, index + 1);
                continue;
            }
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        index += 1;
    }
    deepest
}

/// Removes insignificant white space from valid JSON text, keeping everything else.
pub fn minify(text: &str) -> String {
    compact(text).into_owned()
}

/// Valid JSON text without insignificant white space: borrowed when it has
/// none (as a client's compact text), so the common case copies nothing.
pub fn compact(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let mut out: Option<String> = None;
    let mut run_start = 0;
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b' ' | b'\n' | b'\r' | b'\t' => {
                // White space is ASCII, so the run before it is whole UTF-8.
                out.get_or_insert_with(|| String::with_capacity(text.len())).push_str(&text[run_start..index]);
                run_start = index + 1;
                index += 1;
            }
            b'"' => index = string_end(bytes, index + 1),
            _ => index += 1,
        }
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut out) => {
            out.push_str(&text[run_start..]);
            Cow::Owned(out)
        }
    }
}

/// Where the JSON string whose text starts at `from` ends (just past its
/// closing quote), skipping to each quote or backslash rather than looking
/// at every byte: strings are most of a job's `args`.
fn string_end(bytes: &[u8], mut from: usize) -> usize {
    while let Some(offset) = memchr::memchr2(b'"', b'\\', &bytes[from..]) {
        let at = from + offset;
        if bytes[at] == b'"' {
            return at + 1;
        }
        // A backslash escapes the byte after it.
        from = at + 2;
        if from >= bytes.len() {
            return bytes.len();
        }
    }
    bytes.len()
}

/// Appends bytes that must be ASCII (digits, hex, punctuation we put
/// together), without the general UTF-8 check `str::from_utf8` makes: for
/// the short texts of every response (ids, timestamps) it cost as much as
/// writing them.
#[allow(unsafe_code)]
pub fn push_ascii(out: &mut String, bytes: &[u8]) {
    assert!(bytes.is_ascii(), "push_ascii takes ASCII only");
    // SAFETY: ASCII bytes are whole UTF-8 characters, so `out` stays valid UTF-8.
    unsafe { out.as_mut_vec().extend_from_slice(bytes) }
}

/// The first character of a raw JSON value, which tells its kind.
pub fn kind_of(raw: &RawValue) -> JsonKind {
    match raw.get().trim_start().as_bytes().first() {
        Some(b'{') => JsonKind::Object,
        Some(b'[') => JsonKind::Array,
        Some(b'"') => JsonKind::String,
        Some(b't' | b'f') => JsonKind::Bool,
        Some(b'n') => JsonKind::Null,
        _ => JsonKind::Number,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonKind {
    Object,
    Array,
    String,
    Bool,
    Null,
    Number,
}

impl JsonKind {
    pub fn name(self) -> &'static str {
        match self {
            JsonKind::Object => "object",
            JsonKind::Array => "array",
            JsonKind::String => "string",
            JsonKind::Bool => "boolean",
            JsonKind::Null => "null",
            JsonKind::Number => "number",
        }
    }
}

/// Appends `text` to `out` as a JSON string literal.
pub fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    let bytes = text.as_bytes();
    // Most strings need no escape at all: copy them whole.
    if !bytes.iter().any(|&byte| byte < 0x20 || byte == b'"' || byte == b'\\') {
        out.push_str(text);
        out.push('"');
        return;
    }
    let mut run_start = 0;
    for (index, &byte) in bytes.iter().enumerate() {
        let escape = match byte {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0..=0x1f => "",
            _ => continue,
        };
        // Runs between escapes are whole UTF-8 sequences: escapes are ASCII.
        out.push_str(&text[run_start..index]);
        if escape.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
            out.push(char::from(b"0123456789abcdef"[usize::from(byte & 0xf)]));
        } else {
            out.push_str(escape);
        }
        run_start = index + 1;
    }
    out.push_str(&text[run_start..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_elements_are_kept_only_up_to_the_bound() {
        let raw = |text: &str| RawValue::from_string(text.to_string()).unwrap();
        let three = raw(r#"[1, {"a": [2]}, "x"]"#);
        let kept = raw_elements_at_most(&three, 3).unwrap().unwrap();
        assert_eq!(kept.iter().map(|value| value.get()).collect::<Vec<_>>(), ["1", r#"{"a": [2]}"#, r#""x""#]);
        assert_eq!(raw_elements_at_most(&three, 2).unwrap().err(), Some(3));
        assert_eq!(raw_elements_at_most(&raw("[]"), 0).unwrap().unwrap().len(), 0);
        assert!(raw_elements_at_most(&raw(r#"{"a": 1}"#), 3).is_none());
        assert!(raw_elements_at_most(&raw("7"), 3).is_none());
    }

    #[test]
    fn an_array_member_is_split_as_the_body_is_read() {
        fn member(text: &str, max: usize) -> Result<ArrayMember<&RawValue>, BodyError> {
            parse_array_member(text.as_bytes(), "jobs", max)
        }
        let texts = |member: ArrayMember<&RawValue>| match member {
            ArrayMember::Elements(elements) => elements.iter().map(|raw| raw.get().to_string()).collect::<Vec<_>>(),
            other => panic!("not elements: {other:?}"),
        };
        let body = r#"{"x":{"jobs":[9]},"jobs":[1, {"a":[2]} ,"s"],"y":[3]}"#;
        assert_eq!(texts(member(body, 3).unwrap()), ["1", r#"{"a":[2]}"#, r#""s""#]);
        assert_eq!(texts(member(r#"{"jobs":[]}"#, 3).unwrap()), Vec::<String>::new());
        assert!(matches!(member(r#"{"jobs":[1,2,3,4]}"#, 3), Ok(ArrayMember::TooMany(4))));
        // The first of repeated keys wins, and null counts as absent.
        assert!(matches!(member(r#"{"jobs":null,"jobs":[1]}"#, 3), Ok(ArrayMember::Missing)));
        assert!(matches!(member(r#"{"other":[1]}"#, 3), Ok(ArrayMember::Missing)));
        // The last two only a scan accepts: decoded, they are out of range.
        for not_array in [r#"{"a":1}"#, r#""s""#, "1", "-1", "1.5", "true", "1e400", r#""\ud800""#] {
            let body = format!(r#"{{"jobs":{not_array},"after":0}}"#);
            assert!(matches!(member(&body, 3), Ok(ArrayMember::NotArray)), "{body}");
        }
        assert_eq!(member("[1]", 3).unwrap_err(), BodyError::NotAnObject);
        for malformed in [r#"{"jobs":[1,]}"#, r#"{"jobs":[1]} x"#, r#"{"jobs":[1],"k":tru}"#, r#"{"jobs":[1"#] {
            assert!(matches!(member(malformed, 3), Err(BodyError::Malformed(_))), "{malformed}");
        }
        let deep = format!(r#"{{"jobs":[{}{}]}}"#, "[".repeat(JSON_DEPTH_MAX), "]".repeat(JSON_DEPTH_MAX));
        assert_eq!(member(&deep, 3).unwrap_err(), BodyError::TooDeep);
    }

    #[test]
    fn raw_object_keeps_order_and_number_text() {
        let object = parse_object(br#"{"b": 1.50, "a": [1e2, {"z":1,"y":2}]}"#).unwrap();
        let keys: Vec<_> = object.entries.iter().map(|(key, _)| key.as_ref()).collect();
        assert_eq!(keys, ["b", "a"]);
        assert_eq!(object.get("b").unwrap().get(), "1.50");
        assert_eq!(minify(object.get("a").unwrap().get()), r#"[1e2,{"z":1,"y":2}]"#);
    }

    #[test]
    fn many_keys_are_looked_up_as_one_at_a_time() {
        let object = parse_object(br#"{"a":1,"b":null,"a":2,"c":"x","b":3,"d":null}"#).unwrap();
        let keys = ["a", "b", "c", "d", "e"];
        let one_by_one = keys.map(|key| object.get_present(key).map(RawValue::get));
        assert_eq!(object.get_present_many(&keys).map(|value| value.map(RawValue::get)), one_by_one);
        assert_eq!(one_by_one, [Some("1"), None, Some("\"x\""), None, None]);
        // Raw values carry no surrounding white space, so `null` and `true` compare as text.
        let spaced = parse_object(b"{ \"a\" :\n true , \"b\" :  null\t}").unwrap();
        assert_eq!(spaced.get("a").map(RawValue::get), Some("true"));
        assert!(spaced.get("b").is_some() && spaced.get_present("b").is_none());
    }

    #[test]
    fn body_errors_are_classified() {
        assert!(matches!(parse_object(b"{not json"), Err(BodyError::Malformed(_))));
        assert_eq!(parse_object(b"[1,2]").unwrap_err(), BodyError::NotAnObject);
        let deep = format!("{}{}", "[".repeat(70), "]".repeat(70));
        assert_eq!(parse_object(deep.as_bytes()).unwrap_err(), BodyError::TooDeep);
        // Invalid UTF-8, in a string or not, is malformed JSON and names where it is.
        let error = parse_object(b"{\"a\":\"\xff\"}").unwrap_err();
        assert_eq!(error, BodyError::Malformed("invalid UTF-8 at byte 6 of the body".into()));
        assert!(matches!(parse_object(b"{\"a\":1}\xc3"), Err(BodyError::Malformed(_))));
        // Valid multi-byte text still parses, and keeps its bytes.
        let object = parse_object("{\"é\":\"日本\"}".as_bytes()).unwrap();
        assert_eq!(object.get("é").unwrap().get(), "\"日本\"");
    }

    #[test]
    fn only_real_nesting_counts_toward_the_depth_limit() {
        let brackets_in_a_string = format!(r#"{{"a":"{}"}}"#, "[{".repeat(100));
        assert!(parse_object(brackets_in_a_string.as_bytes()).is_ok());
        let nested = |depth: usize| format!(r#"{{"a":{}{}}}"#, "[".repeat(depth - 1), "]".repeat(depth - 1));
        assert!(parse_object(nested(JSON_DEPTH_MAX).as_bytes()).is_ok());
        assert_eq!(parse_object(nested(JSON_DEPTH_MAX + 1).as_bytes()).unwrap_err(), BodyError::TooDeep);
    }

    /// The nesting depth as a plain byte-at-a-time scan finds it.
    fn depth_byte_by_byte(bytes: &[u8]) -> usize {
        let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
        for &byte in bytes {
            if in_string {
                if escaped {
                    escaped = false;
                } else if byte == b'\\' {
                    escaped = true;
                } else if byte == b'"' {
                    in_string = false;
                }
                continue;
            }
            match byte {
                b'"' => in_string = true,
                b'[' | b'{' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        deepest
    }

    proptest::proptest! {
        /// Skipping strings a quote or backslash at a time finds the depth a
        /// byte-by-byte scan does, on any bytes (the check runs before the
        /// body is known to be JSON): escapes, unterminated strings, stray
        /// closers.
        #[test]
        fn skipping_strings_finds_the_same_depth(
            bytes in proptest::collection::vec(proptest::sample::select(b"[]{}\"\\ax".to_vec()), 0..200)
        ) {
            proptest::prop_assert_eq!(nesting_depth(&bytes), depth_byte_by_byte(&bytes));
        }
    }

    #[test]
    fn plain_strings_are_borrowed_and_others_are_not() {
        let object = parse_object(br#"{"a":"x.y","b":"x\"y","c":1,"d":"","e":["z"]}"#).unwrap();
        let plain = |key: &str| plain_string(object.get(key).unwrap());
        assert_eq!((plain("a"), plain("d")), (Some("x.y"), Some("")));
        assert_eq!((plain("b"), plain("c"), plain("e")), (None, None, None));
    }

    #[test]
    fn ascii_is_appended_as_is() {
        let mut out = String::from("é");
        push_ascii(&mut out, b"2026-01-01T00:00:00Z");
        assert_eq!(out, "é2026-01-01T00:00:00Z");
    }

    #[test]
    #[should_panic(expected = "ASCII only")]
    fn anything_but_ascii_is_refused() {
        push_ascii(&mut String::new(), "é".as_bytes());
    }

    #[test]
    fn minify_leaves_strings_alone() {
        assert_eq!(minify(r#"{ "a b" : [ 1 , "x \" y" ] }"#), r#"{"a b":[1,"x \" y"]}"#);
        // Escaped backslashes just before a closing quote, and a string that
        // ends the text.
        assert_eq!(minify(r#"[ "a\\" , "b\\\" c" , "d e" ]"#), r#"["a\\","b\\\" c","d e"]"#);
        assert_eq!(minify(r#" "x y\\" "#), r#""x y\\""#);
    }

    #[test]
    fn compact_text_is_borrowed_and_spaced_text_is_compacted() {
        let compact_text = r#"{"a b":[1,"x \" y"],"c":{}}"#;
        assert!(matches!(compact(compact_text), Cow::Borrowed(text) if text == compact_text));
        let spaced = compact("[1,\n\t\"a b\" ]");
        assert!(matches!(&spaced, Cow::Owned(_)));
        assert_eq!(spaced, r#"[1,"a b"]"#);
    }

    #[test]
    fn json_strings_are_escaped() {
        let mut out = String::new();
        push_json_string(&mut out, "a\"b\\c\n\u{1}");
        assert_eq!(out, r#""a\"b\\c\n\u0001""#);
        assert!(serde_json::from_str::<String>(&out).is_ok());
    }

    #[test]
    fn escaping_and_minifying_keep_other_characters_whole() {
        for text in ["plain", "", "é\u{1f600}\t日本\u{1f}\"", "\\\\", "tab\tend"] {
            let mut out = String::new();
            push_json_string(&mut out, text);
            assert_eq!(serde_json::from_str::<String>(&out).unwrap(), text);
        }
        assert_eq!(minify("[ \"é 日\" ,\n\t{ \"\u{1f600}\" : 1 } ]"), "[\"é 日\",{\"\u{1f600}\":1}]");
    }
}
