import Foundation

/// Random bytes in a file under `directory`.
public func makeFile(_ directory: String, _ name: String, size: Int, seed: UInt64 = 1) -> (path: String, data: Data) {
    var rng = SeededGenerator(seed: seed)
    var bytes = [UInt8](repeating: 0, count: size)
    var i = 0
    while i < size {
        var word = rng.next()
        for _ in 0..<8 where i < size {
            bytes[i] = UInt8(truncatingIfNeeded: word)
            word >>= 8
            i += 1
        }
    }
    let path = directory + "/" + name
    try! FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
    let data = Data(bytes)
    // A file that cannot be made would fail the test later, under a misleading message: say it here.
    guard FileManager.default.createFile(atPath: path, contents: data) else { fatalError("cannot create the test file \(path)") }
    return (path, data)
}
