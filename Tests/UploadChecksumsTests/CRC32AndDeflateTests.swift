import Foundation
import Testing
import UploadChecksums
import UploadTestSupport

@Suite("CRC32 and deflate from zlib or libdeflate")
struct CRC32AndDeflateTests {
    @Test("libdeflate is used when its shared library is installed, unless UPLOAD_DEFLATE_LIBRARY=zlib; zlib otherwise")
    func library() async {
        let installed = ["/usr/lib/x86_64-linux-gnu/libdeflate.so.0", "/usr/lib/aarch64-linux-gnu/libdeflate.so.0"]
            .contains { FileManager.default.fileExists(atPath: $0) }
        let zlibAsked = ProcessInfo.processInfo.environment["UPLOAD_DEFLATE_LIBRARY"] == "zlib"
        #expect(Deflate.library == (installed && !zlibAsked ? "libdeflate" : "zlib"))
    }

    @Test("CRC-32 check value and empty input")
    func checkValue() async {
        #expect(CRC32.checksum(Array("123456789".utf8)) == 0xCBF4_3926)
        #expect(CRC32.checksum([UInt8]()) == 0)
        #expect(CRC32.checksum(Array("The quick brown fox jumps over the lazy dog".utf8)) == 0x414F_A339)
    }

    @Test("incremental CRC equals one-shot")
    func incremental() async {
        var rng = SeededGenerator(seed: 3)
        let data = (0..<5000).map { _ in UInt8.random(in: 0...255, using: &rng) }
        var crc = CRC32()
        var index = 0
        while index < data.count {
            let n = min(data.count - index, Int.random(in: 1...777, using: &rng))
            crc.update(data[index..<index + n])
            index += n
        }
        #expect(crc.value == CRC32.checksum(data))
    }

    static func compress(_ input: [UInt8]) -> [UInt8]? {
        var out = [UInt8](repeating: 0, count: Deflate.bound(input.count))
        let n = input.withUnsafeBytes { i in out.withUnsafeMutableBytes { Deflate.compress(i, into: $0) } }
        return n.map { Array(out[0..<$0]) }
    }

    static func inflate(_ input: [UInt8], rawLength: Int) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: rawLength)
        try input.withUnsafeBytes { i in try out.withUnsafeMutableBytes { try Deflate.inflate(i, into: $0) } }
        return out
    }

    @Test("compressible data round-trips and shrinks")
    func roundTrip() async throws {
        let text = Array(String(repeating: "photo gallery upload ", count: 500).utf8)
        let packed = try #require(Self.compress(text))
        #expect(packed.count < text.count / 10)
        #expect(try Self.inflate(packed, rawLength: text.count) == text)
    }

    @Test("incompressible data is left raw")
    func incompressible() async {
        var rng = SeededGenerator(seed: 5)
        let noise = (0..<4096).map { _ in UInt8.random(in: 0...255, using: &rng) }
        #expect(Self.compress(noise) == nil)
    }

    @Test("a wrong raw length, corrupt or trailing data is refused")
    func badInput() async throws {
        let text = Array(String(repeating: "abc", count: 300).utf8)
        let packed = try #require(Self.compress(text))
        #expect(throws: Deflate.InflateError.self) { try Self.inflate(packed, rawLength: text.count - 1) }
        #expect(throws: Deflate.InflateError.self) { try Self.inflate(packed, rawLength: text.count + 1) }
        var corrupt = packed
        corrupt[corrupt.count / 2] ^= 0xFF
        #expect(throws: Deflate.InflateError.self) { try Self.inflate(corrupt, rawLength: text.count) }
        #expect(throws: Deflate.InflateError.self) { try Self.inflate(packed + [0], rawLength: text.count) }
        #expect(throws: Deflate.InflateError.self) { try Self.inflate(Array(packed.dropLast()), rawLength: text.count) }
    }

    @Test("a stream zlib made (level 9) inflates; ours start with a zlib header and end with the Adler-32 of the bytes")
    func zlibInterop() async throws {
        let raw = Array(String(repeating: "zlib made this stream at level 9; libdeflate reads it. ", count: 20).utf8)
        let made = Self.bytes(
            hex: "78daedcbb10d80400c04c156ae02724435463e84257f824f045f3d1f5284e3dd9919278639a13b0aa587366042f265"
                + "623fb006e7952662352f8436cc66cd9a35fbb30f57e2828c"
        )
        #expect(try Self.inflate(made, rawLength: raw.count) == raw)
        let ours = try #require(Self.compress(raw))
        #expect(ours[0] == 0x78 && (UInt16(ours[0]) << 8 | UInt16(ours[1])) % 31 == 0)  // RFC 1950 CMF/FLG
        #expect(Array(ours.suffix(4)) == Self.bigEndian(Self.adler32(raw)))
    }

    @Test("a stream that inflates far beyond the announced length stops at it")
    func bomb() async throws {
        let zeros = [UInt8](repeating: 0, count: 4 << 20)
        let packed = try #require(Self.compress(zeros))
        #expect(throws: Deflate.InflateError.self) { try Self.inflate(packed, rawLength: 60000) }
    }

    static func bytes(hex: String) -> [UInt8] {
        var result: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            result.append(UInt8(hex[index..<next], radix: 16) ?? 0)
            index = next
        }
        return result
    }

    static func adler32(_ bytes: [UInt8]) -> UInt32 {
        var a: UInt32 = 1
        var b: UInt32 = 0
        for byte in bytes {
            a = (a + UInt32(byte)) % 65521
            b = (b + a) % 65521
        }
        return b << 16 | a
    }

    static func bigEndian(_ value: UInt32) -> [UInt8] {
        [UInt8(value >> 24), UInt8(value >> 16 & 0xFF), UInt8(value >> 8 & 0xFF), UInt8(value & 0xFF)]
    }
}
