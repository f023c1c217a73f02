import NIOCore
import Foundation

/// The little XML S3 answers with (an upload id, an error's code, a listing's entries), read by element name.
///
/// Not a general XML parser: S3's answers are flat, namespaced by a default `xmlns` only, and never nest an element in
/// one of the same name; values are text with the five predefined entities and numeric references. That is all this
/// reads. An answer it cannot read yields nil, which the client reports as an error naming the operation.
enum S3XML {
    /// The text of the first `<name>...</name>` in `xml`, entities decoded; nil when there is none.
    static func value(of name: String, in xml: ByteBuffer) -> String? {
        Self.value(of: name, in: String(buffer: xml))
    }

    static func value(of name: String, in xml: String) -> String? {
        Self.elements(name, in: xml).first.map(Self.unescape)
    }

    /// The inner text of every `<name>...</name>` (or `<name attr="...">`) in order.
    static func elements(_ name: String, in xml: ByteBuffer) -> [String] {
        Self.elements(name, in: String(buffer: xml))
    }

    static func elements(_ name: String, in xml: String) -> [String] {
        var found: [String] = []
        var rest = xml[...]
        let close = "</\(name)>"
        while let open = rest.range(of: "<\(name)") {
            let after = rest[open.upperBound...]
            guard let first = after.first else { break }
            if first == "/" {  // <Name/>: empty
                found.append("")
                rest = after.dropFirst()
                continue
            }
            guard first == ">" || first == " " else {  // <NameOther>: another element
                rest = after
                continue
            }
            guard let end = after.firstIndex(of: ">") else { break }
            if end > after.startIndex, after[after.index(before: end)] == "/" {  // <Name attr="x"/>
                found.append("")
                rest = after[after.index(after: end)...]
                continue
            }
            let body = after[after.index(after: end)...]
            guard let closing = body.range(of: close) else { break }
            found.append(String(body[..<closing.lowerBound]))
            rest = body[closing.upperBound...]
        }
        return found
    }

    static func unescape(_ text: String) -> String {
        guard text.contains("&") else { return text }
        var out = ""
        var rest = text[...]
        while let amp = rest.firstIndex(of: "&") {
            out += rest[..<amp]
            let tail = rest[amp...]
            guard let semi = tail.firstIndex(of: ";"), tail.distance(from: amp, to: semi) <= 10 else {
                out += "&"
                rest = tail.dropFirst()
                continue
            }
            let entity = tail[tail.index(after: amp)..<semi]
            let named = ["amp": "&", "lt": "<", "gt": ">", "quot": "\"", "apos": "'"]
            if let value = named[String(entity)] {
                out += value
            } else if entity.hasPrefix("#x"), let code = UInt32(entity.dropFirst(2), radix: 16), let scalar = Unicode.Scalar(code) {
                out.unicodeScalars.append(scalar)
            } else if entity.hasPrefix("#"), let code = UInt32(entity.dropFirst()), let scalar = Unicode.Scalar(code) {
                out.unicodeScalars.append(scalar)
            } else {
                out += tail[...semi]
            }
            rest = tail[tail.index(after: semi)...]
        }
        return out + rest
    }

    /// `text` with `& < > " '` as entities, for a value written into a request.
    static func escape(_ text: String) -> String {
        var out = ""
        for character in text {
            switch character {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&apos;"
            default: out.append(character)
            }
        }
        return out
    }
}
