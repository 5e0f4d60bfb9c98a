"""Word pools for the synthetic catalog: fictional brands, products, specs and review sentences.

Invented brands make no claim about real companies; with random codes and prices they give mixed-script titles,
reviews of ~10 to ~200 tokens and sentiment recoverable from polar words.
"""

from __future__ import annotations

# (label, English name, median price in yuan, brands, products (zh, en), spec attributes)
CATEGORY_TABLE: tuple[tuple, ...] = (
    ("手机", "phones", 2999.0,
     ("星驰", "NovaTech", "米粒", "Zenith"),
     (("智能手机", "Smartphone"), ("折叠屏手机", "Foldable Phone"), ("老人机", "Senior Phone")),
     (("颜色", ("黑色", "白色", "远峰蓝", "Silver")), ("容量", ("128GB", "256GB", "512GB", "1TB")),
      ("网络", ("5G", "4G", "5G双卡")))),
    ("服饰", "apparel", 199.0,
     ("云裳", "UrbanFit", "北岸", "Linea"),
     (("纯棉T恤", "Cotton T-Shirt"), ("羽绒服", "Down Jacket"), ("牛仔裤", "Slim Jeans"), ("连衣裙", "Summer Dress")),
     (("颜色", ("黑色", "米白", "藏青", "Beige")), ("尺码", ("S", "M", "L", "XL", "XXL")),
      ("材质", ("纯棉", "聚酯纤维", "羊毛")))),
    ("美妆", "beauty", 159.0,
     ("花漾", "Lumiere", "雪肌", "Verde"),
     (("保湿面霜", "Moisturizing Cream"), ("口红", "Matte Lipstick"), ("防晒霜", "Sunscreen SPF50")),
     (("容量", ("30ml", "50ml", "100ml")), ("肤质", ("干性", "油性", "混合性", "所有肤质")))),
    ("家电", "appliances", 1299.0,
     ("海风", "Aerona", "美域", "Kelvin"),
     (("空气炸锅", "Air Fryer"), ("扫地机器人", "Robot Vacuum"), ("电热水壶", "Electric Kettle")),
     (("功率", ("800W", "1200W", "1800W")), ("颜色", ("白色", "灰色", "Black")),
      ("电压", ("220V",)))),
    ("食品", "food", 49.0,
     ("田园记", "GoldenHarvest", "三只熊", "Nordic Bites"),
     (("坚果礼盒", "Mixed Nuts"), ("挂耳咖啡", "Drip Coffee"), ("牛肉干", "Beef Jerky")),
     (("净含量", ("250g", "500g", "1kg")), ("口味", ("原味", "香辣", "Salted")))),
    ("图书", "books", 59.0,
     ("墨香出版", "Harbor Press", "青禾文化", "Quill House"),
     (("Python编程入门", "Python Programming"), ("深度学习实战", "Deep Learning in Practice"),
      ("儿童绘本", "Picture Book")),
     (("装帧", ("平装", "精装")), ("页数", ("256页", "384页", "512页")))),
    ("运动", "sports", 299.0,
     ("疾风", "Stride", "峰行", "Apex"),
     (("跑步鞋", "Running Shoes"), ("瑜伽垫", "Yoga Mat"), ("速干运动衣", "Dri-Fit Tee")),
     (("尺码", ("39", "40", "41", "42", "43")), ("颜色", ("荧光绿", "黑色", "Navy")))),
    ("母婴", "baby", 129.0,
     ("小禾苗", "BabyJoy", "贝贝乐", "Tinytots"),
     (("纸尿裤", "Diapers"), ("婴儿推车", "Baby Stroller"), ("奶瓶", "Baby Bottle")),
     (("适用年龄", ("0-6个月", "6-12个月", "1-3岁")), ("规格", ("S码", "M码", "L码", "XL码")))),
    ("数码配件", "accessories", 89.0,
     ("闪电侠", "VoltEdge", "极客", "Pixelink"),
     (("充电宝", "Power Bank"), ("无线耳机", "Wireless Earbuds"), ("数据线", "USB-C Cable")),
     (("容量", ("10000mAh", "20000mAh")), ("接口", ("USB-C", "Lightning")), ("颜色", ("黑色", "白色")))),
    ("家居", "home", 199.0,
     ("木与", "Hearth", "栖居", "Casa Nova"),
     (("四件套床品", "Bedding Set"), ("收纳箱", "Storage Box"), ("香薰蜡烛", "Scented Candle")),
     (("尺寸", ("1.5m", "1.8m", "大号", "小号")), ("颜色", ("浅灰", "奶白", "Sage")))),
)

ENGLISH_TITLE_WORDS: tuple[str, ...] = ("Pro", "Ultra", "Classic", "2024 New", "Premium", "Lite", "Max")
CHINESE_TITLE_WORDS: tuple[str, ...] = ("旗舰款", "新款", "官方正品", "热销", "限量版", "升级版")

# Each opener of a review carries at least one strongly polar word of its sentiment.
POSITIVE_WORDS: tuple[str, ...] = ("太棒了", "非常满意", "物超所值", "amazing", "excellent", "love")
NEGATIVE_WORDS: tuple[str, ...] = ("垃圾", "太差了", "假货", "terrible", "awful", "worst")

OPENERS: dict[tuple[str, str], tuple[str, ...]] = {
    ("positive", "zh"): ("太棒了!", "质量太棒了,超出预期!", "非常满意,五星好评!", "物超所值,强烈推荐!"),
    ("positive", "en"): ("Amazing!", "Absolutely amazing quality!", "Excellent product, highly recommend!",
                         "I love it, works perfectly!"),
    ("neutral", "zh"): ("还行吧,中规中矩。", "一般般,没有特别惊喜。", "凑合能用。", "和预期差不多。"),
    ("neutral", "en"): ("It's okay.", "Average, nothing special.", "Does the job, nothing more.",
                        "About what I expected."),
    ("negative", "zh"): ("垃圾,千万别买!", "太差了,非常失望!", "质量垃圾,后悔买了!", "假货,差评!"),
    ("negative", "en"): ("Terrible!", "Terrible quality, a total waste of money.", "Awful product, do not buy!",
                         "Worst purchase ever, very disappointed."),
}

# Body sentences: sentiment-coloured ones (no polar keyword) and plain observations.
BODY: dict[tuple[str, str], tuple[str, ...]] = {
    ("positive", "zh"): ("做工很精致,手感很好。", "用了一周,效果非常好。", "客服态度特别好,很耐心。",
                         "包装很用心,送朋友也有面子。", "性价比很高,已经推荐给家人。", "细节处理得很到位。"),
    ("positive", "en"): ("The build quality is great and it feels solid.", "After a week of use it still works great.",
                         "Customer service was patient and helpful.", "Great value for the price.",
                         "My whole family uses it every day now."),
    ("negative", "zh"): ("做工粗糙,边缘还有毛刺。", "用了两天就坏了。", "客服一直不回复,退货也很麻烦。",
                         "和图片严重不符,颜色差很多。", "味道很大,根本没法用。", "说明书也看不懂。"),
    ("negative", "en"): ("It stopped working after two days.", "The seller never answered my messages.",
                         "It looks nothing like the pictures.", "There is a strong chemical smell.",
                         "The return process was a nightmare."),
    ("neutral", "zh"): ("物流三天到货。", "包装完好无破损。", "颜色和图片基本一致。", "尺寸和描述一样。",
                        "目前用了几天,再观察一下。", "价格不算便宜也不算贵。", "快递员送货上门。",
                        "赶上活动买的,比平时便宜一点。", "给家里老人买的。", "第二次购买了。"),
    ("neutral", "en"): ("Delivery took three days.", "The box arrived undamaged.",
                        "The colour matches the photos.", "The size is as described.",
                        "I have only used it for a few days so far.", "I bought it during a sale.",
                        "It was a gift for my parents.", "This is my second order."),
}

CLOSERS: dict[tuple[str, str], tuple[str, ...]] = {
    ("positive", "zh"): ("会回购的!", "下次还来!", ""),
    ("positive", "en"): ("Will buy again!", "Five stars.", ""),
    ("neutral", "zh"): ("暂时给三星吧。", ""),
    ("neutral", "en"): ("Three stars for now.", ""),
    ("negative", "zh"): ("已经申请退货。", "不会再买了。", ""),
    ("negative", "en"): ("Returning it.", "Never again.", ""),
}
