import Testing
import UploadProtocol

/// ``Printable``: what a peer or a file system says reaches a log or a terminal escaped (SPEC §12.4).
@Suite("Printable text")
struct PrintableTests {
    @Test("controls, C1, bidirectional overrides, separators and the backslash are escaped; other text is left as it is")
    func escapes() {
        #expect(Printable.escaped("photo.jpg") == "photo.jpg")
        #expect(Printable.escaped("café/日本.heic") == "café/日本.heic")
        #expect(Printable.escaped("agent\n2026-12-01 notice token rotated") == "agent\\n2026-12-01 notice token rotated")
        #expect(Printable.escaped("\u{1b}[2Jx") == "\\u001b[2Jx")
        #expect(Printable.escaped("a\r\tb\u{7f}") == "a\\r\\tb\\u007f")
        #expect(Printable.escaped("cam\u{9b}2J") == "cam\\u009b2J")
        #expect(Printable.escaped("photo\u{202e}gpj.exe") == "photo\\u202egpj.exe")
        #expect(Printable.escaped("a\u{2028}b\u{2066}c") == "a\\u2028b\\u2066c")
        #expect(Printable.escaped("C:\\u001b") == "C:\\\\u001b", "a backslash in the input never reads as an escape")
    }

    @Test("bytes that are not UTF-8 show as \\xNN; well-formed sequences around them are kept")
    func bytes() {
        #expect(Printable.escaped(bytes: Array("ok".utf8)) == "ok")
        #expect(Printable.escaped(bytes: [0x66, 0xFF, 0x6F]) == "f\\xffo")
        // A lead byte without its continuation, an overlong "/", an encoded surrogate, then valid é.
        #expect(Printable.escaped(bytes: [0xC3, 0x41, 0xC0, 0xAF, 0xED, 0xA0, 0x80, 0xC3, 0xA9]) == "\\xc3A\\xc0\\xaf\\xed\\xa0\\x80é")
        #expect(Printable.escaped(bytes: [0x1B, 0x5B]) == "\\u001b[")
    }

    @Test("a display string refuses what would be escaped, the backslash aside")
    func controls() {
        #expect(!Printable.hasControl("upload-agent/1.0 (cam-7) C:\\x"))
        #expect(Printable.hasControl("a\nb"))
        #expect(Printable.hasControl("a\u{85}"))
        #expect(Printable.hasControl("a\u{200f}"))
    }
}
