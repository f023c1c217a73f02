import CUploadZlib

/// Per-chunk compression with zlib (RFC 1950 streams, as `compress2` and `uncompress2` make and read them) (SPEC §9).
public enum Deflate {
    /// Why a deflated chunk could not be inflated.
    public struct InflateError: Error, Hashable, Sendable, CustomStringConvertible {
        public var description: String
    }

    /// The most bytes `compress(_:into:level:)` can write for `count` input bytes.
    public static func bound(_ count: Int) -> Int {
        Int(compressBound(UInt(count)))
    }

    /// Compresses `input` into `output`; returns the compressed length, or nil when compression
    /// does not make the chunk smaller (SPEC §9: such a chunk goes raw).
    public static func compress(
        _ input: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer, level: Int32 = 1
    ) -> Int? {
        guard let source = input.baseAddress, let destination = output.baseAddress, input.count > 0 else { return nil }
        var length = UInt(output.count)
        let status = compress2(
            destination.assumingMemoryBound(to: Bytef.self), &length, source.assumingMemoryBound(to: Bytef.self),
            UInt(input.count), level
        )
        guard status == Z_OK, Int(length) < input.count else { return nil }
        return Int(length)
    }

    /// Inflates `input`, which must be one whole zlib stream of exactly `output.count` bytes.
    public static func inflate(_ input: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer) throws {
        guard let source = input.baseAddress, let destination = output.baseAddress else {
            throw InflateError(description: "empty deflated data")
        }
        var outLength = UInt(output.count)
        var inLength = UInt(input.count)
        let status = uncompress2(
            destination.assumingMemoryBound(to: Bytef.self), &outLength, source.assumingMemoryBound(to: Bytef.self),
            &inLength
        )
        switch status {
        case Z_OK:
            guard outLength == UInt(output.count) else {
                throw InflateError(description: "deflated data inflates to \(outLength) bytes, not the \(output.count) announced")
            }
            guard inLength == UInt(input.count) else {
                throw InflateError(description: "\(UInt(input.count) - inLength) bytes follow the end of the deflated data")
            }
        case Z_BUF_ERROR where outLength == UInt(output.count):
            throw InflateError(description: "deflated data inflates to more than the \(output.count) bytes announced")
        case Z_BUF_ERROR:
            throw InflateError(description: "deflated data is truncated")
        case Z_DATA_ERROR:
            throw InflateError(description: "deflated data is corrupt")
        default:
            throw InflateError(description: "zlib failed with status \(status)")
        }
    }
}
