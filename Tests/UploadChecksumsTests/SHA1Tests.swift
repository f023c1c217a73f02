import Testing
import UploadChecksums
import UploadTestSupport

@Suite("SHA-1 from libcrypto")
struct SHA1Tests {
    static func hex(_ bytes: [UInt8]) -> String {
        bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
    }

    @Test(
        "FIPS 180 published vectors",
        arguments: [
            ("", "da39a3ee5e6b4b0d3255bfef95601890afd80709"),
            ("abc", "a9993e364706816aba3e25717850c26c9cd0d89d"),
            ("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "84983e441c3bd26ebaae4aa1f95129e5e54670f1"),
        ])
    func publishedVectors(input: String, expected: String) async {
        #expect(Self.hex(SHA1.hash(Array(input.utf8))) == expected)
    }

    @Test("the million \"a\" vector, fed in uneven pieces")
    func millionA() async {
        var sha = SHA1()
        let piece = [UInt8](repeating: UInt8(ascii: "a"), count: 999)
        var left = 1_000_000
        while left > 0 {
            let n = min(left, piece.count)
            sha.update(piece[0..<n])
            left -= n
        }
        #expect(sha.byteCount == 1_000_000)
        #expect(Self.hex(sha.finalize()) == "34aa973cd4c4daa4f61eeb2bdbad27316534016f")
    }

    @Test("random splits give the one-shot digest")
    func randomSplits() async {
        var rng = SeededGenerator(seed: 7)
        let data = (0..<10_000).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let expected = SHA1.hash(data)
        for _ in 0..<50 {
            var sha = SHA1()
            var index = 0
            while index < data.count {
                let n = min(data.count - index, Int.random(in: 0...300, using: &rng))
                sha.update(data[index..<index + n])
                index += n
            }
            #expect(sha.finalize() == expected)
        }
    }

    @Test("hash half, export, import in a fresh value, finish == one-shot, at every offset of a few blocks")
    func exportImportRoundTrip() async throws {
        var rng = SeededGenerator(seed: 11)
        let data = (0..<300).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let expected = SHA1.hash(data)
        for split in 0...data.count {
            var first = SHA1()
            first.update(data[0..<split])
            let state = first.exportState()
            #expect(state.count == 29 + split % 64)
            var second = try SHA1(importing: state)
            #expect(second.byteCount == UInt64(split))
            second.update(data[split...])
            #expect(second.finalize() == expected, "split at \(split)")
        }
    }

    @Test("finalize does not disturb a hash that goes on")
    func finalizeIsNonDestructive() async {
        var sha = SHA1()
        sha.update(Array("ab".utf8))
        _ = sha.finalize()
        sha.update(Array("c".utf8))
        #expect(Self.hex(sha.finalize()) == "a9993e364706816aba3e25717850c26c9cd0d89d")
    }

    @Test("malformed exported state is refused")
    func malformedState() async {
        var sha = SHA1()
        sha.update(Array("hello".utf8))
        let good = sha.exportState()
        #expect(throws: SHA1.StateError.self) { try SHA1(importing: []) }
        #expect(throws: SHA1.StateError.self) { try SHA1(importing: [2] + good.dropFirst()) }
        #expect(throws: SHA1.StateError.self) { try SHA1(importing: Array(good.dropLast())) }
        #expect(throws: SHA1.StateError.self) { try SHA1(importing: good + [0]) }
    }
}
